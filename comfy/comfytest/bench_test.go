package comfytest_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
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

// BenchmarkServerJob measures the fake's share of a pool's job: POST
// /prompt of a two-node workflow (an 8x8 image, saved) with a new colour
// each time, the frames until executing{node:null} read without decoding,
// GET /history/{id} and GET /system_stats, in memory. B/op is mostly the
// fake's (and net/http's) garbage per prompt.
func BenchmarkServerJob(b *testing.B) {
	s := comfytest.NewInMemoryServer(nil)
	defer s.Close()
	ws := dial(b, s, "?clientId="+cid)
	ws.next()
	hc := s.Client()
	scratch := make([]byte, 64<<10)
	request := func(req *http.Request) {
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.ReadFull(resp.Body, scratch)
		resp.Body.Close()
		if resp.StatusCode != 200 || n == 0 {
			b.Fatal(resp.Status, string(scratch[:n]))
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		body := fmt.Sprintf(`{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": %d}}, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "bench"}}}, "client_id": %q, "prompt_id": %q}`, i%0x1000000, cid, id)
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/prompt", strings.NewReader(body))
		request(req)
		for {
			_, r, err := ws.c.Reader(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.ReadFull(r, scratch)
			if bytes.HasPrefix(scratch[:n], []byte(`{"type": "executing", "data": {"node": null`)) {
				break
			}
		}
		req, _ = http.NewRequest(http.MethodGet, s.URL+"/history/"+id, nil)
		request(req)
		req, _ = http.NewRequest(http.MethodGet, s.URL+"/system_stats", nil)
		request(req)
	}
}
