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
	benchRoundTrips(b, func(i int) string {
		return strings.Replace(string(comfytest.WorkflowOK), `"color":0`, `"color":`+strconv.Itoa(i%0xFFFFFF), 1)
	})
}

// BenchmarkDefaultWorkflow measures POST /prompt -> executing{node:null}
// for ComfyUI's default workflow with a new seed each time (nothing
// cached): 7 nodes, 20 progress steps with a JPEG preview each, one
// 512x512 PNG saved.
func BenchmarkDefaultWorkflow(b *testing.B) {
	wf := string(comfytest.DefaultWorkflow())
	benchRoundTrips(b, func(i int) string {
		return strings.Replace(wf, `"seed": 156680208700286`, `"seed": `+strconv.Itoa(i), 1)
	})
}

// benchRoundTrips posts workflow(i) for i = 0..b.N-1 to a fresh server on
// loopback and one in memory, each time waiting for its end on the
// WebSocket.
func benchRoundTrips(b *testing.B, workflow func(i int) string) {
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
				resp, err := s.Client().Post(s.URL+"/prompt", "application/json", strings.NewReader(prompt(workflow(i), "")))
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				ws.untilDone()
			}
		})
	}
}
