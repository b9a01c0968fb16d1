package comfytest_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// BenchmarkPromptRoundTrip measures POST /prompt -> executing{node:null} on
// the WebSocket for a non-cached WorkflowOK (3 nodes, one PNG saved).
func BenchmarkPromptRoundTrip(b *testing.B) {
	for _, m := range []struct {
		name string
		new  func(*comfytest.Options) *comfytest.Server
	}{{"loopback", comfytest.NewServer}, {"memory", comfytest.NewInMemoryServer}} {
		b.Run(m.name, func(b *testing.B) {
			s := m.new(nil)
			defer s.Close()
			ws := dial(b, s, "?clientId="+cid)
			ws.next()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				wf := strings.Replace(string(comfytest.WorkflowOK), `"color":0`, `"color":`+strconv.Itoa(i%0xFFFFFF), 1)
				resp, err := s.Client().Post(s.URL+"/prompt", "application/json", strings.NewReader(prompt(wf, "")))
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				ws.untilDone()
			}
		})
	}
}
