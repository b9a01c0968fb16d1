package comfytest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

const graphA = `{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":48,"batch_size":1,"color":16711680}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"comfyreal_test"}},"4":{"class_type":"PreviewImage","inputs":{"images":["2",0]}}}`
const graphB2 = `{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":48,"batch_size":1,"color":16711680}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"comfyreal_test"}},"4":{"class_type":"PreviewImage","inputs":{"images":["2",0]}},"5":{"class_type":"ImageBlur","inputs":{"image":["2",0],"blur_radius":1,"sigma":1}},"6":{"class_type":"PreviewImage","inputs":{"images":["5",0]}}}`
const graphC2 = `{"1":{"class_type":"EmptyImage","inputs":{"width":32,"height":32,"batch_size":1,"color":0}},"2":{"class_type":"ImageToMask","inputs":{"image":["1",0],"channel":"alpha"}},"3":{"class_type":"MaskToImage","inputs":{"mask":["2",0]}},"4":{"class_type":"PreviewImage","inputs":{"images":["3",0]}}}`

// TestGoldenRunSequences replays transcripts (a) normal, (b) fully cached,
// (b2) partly cached and (c2) runtime error on one socket and compares every
// frame byte for byte (ids, timestamps and temp names normalised).
func TestGoldenRunSequences(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		assert.Equal(t, `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "`+cid+`"}}`, ws.next())

		code, body := post(t, s, "/prompt", prompt(graphA, ""))
		require.Equal(t, 200, code)
		pa := promptIDOf(t, body)
		assert.Equal(t, `{"prompt_id": "`+pa+`", "number": 0, "node_errors": {}}`, body)
		assert.Equal(t, normalize(golden(t, "a_0")[1:]), normalize(ws.untilDone()), "transcript (a)")

		code, body = post(t, s, "/prompt", prompt(graphA, ""))
		require.Equal(t, 200, code)
		assert.Contains(t, body, `"number": 1,`)
		assert.Equal(t, normalize(golden(t, "b_0")), normalize(ws.untilDone()), "transcript (b)")

		code, _ = post(t, s, "/prompt", prompt(graphB2, ""))
		require.Equal(t, 200, code)
		gotB2 := normalize(ws.untilDone())
		assert.Equal(t, normalize(golden(t, "b2_0")), gotB2, "transcript (b2)")
		// The cached replay names the very files of run (a): no new file.
		assert.Contains(t, gotB2[6], `"output": {"images": [{"filename": "comfyreal_test_00001_.png"`)

		code, body = post(t, s, "/prompt", prompt(graphC2, ""))
		require.Equal(t, 200, code)
		pc := promptIDOf(t, body)
		assert.Equal(t, normalize(golden(t, "c2_0")), normalize(ws.untilDone()), "transcript (c2)")

		// History of (a) and (c2).
		_, h, _ := get(t, s, "/history/"+pa)
		var ha map[string]struct {
			Prompt  []json.RawMessage          `json:"prompt"`
			Outputs map[string]json.RawMessage `json:"outputs"`
			Status  struct {
				StatusStr string  `json:"status_str"`
				Completed bool    `json:"completed"`
				Messages  [][]any `json:"messages"`
			} `json:"status"`
		}
		require.NoError(t, json.Unmarshal([]byte(h), &ha))
		assert.Equal(t, "success", ha[pa].Status.StatusStr)
		assert.True(t, ha[pa].Status.Completed)
		assert.Equal(t, `["4", "3"]`, string(ha[pa].Prompt[4]))
		assert.Contains(t, h, `"outputs": {"4": {"images": [{"filename": "ComfyUI_temp_`)
		assert.Contains(t, h, `"3": {"images": [{"filename": "comfyreal_test_00001_.png", "subfolder": "", "type": "output"}]}}, "status"`)
		assert.Contains(t, h, `"meta": {"4": {"node_id": "4", "display_node": "4", "parent_node": null, "real_node_id": "4"}, "3": {"node_id": "3"`)

		_, h, _ = get(t, s, "/history/"+pc)
		require.NoError(t, json.Unmarshal([]byte(h), &ha))
		assert.Equal(t, "error", ha[pc].Status.StatusStr)
		assert.False(t, ha[pc].Status.Completed)
		msgs := ha[pc].Status.Messages
		require.Len(t, msgs, 3)
		assert.Equal(t, "execution_error", msgs[2][0])

		// The saved output is a real PNG served by /view.
		code, img, hdr := get(t, s, "/view?filename=comfyreal_test_00001_.png&subfolder=&type=output")
		require.Equal(t, 200, code)
		assert.Equal(t, "image/png", hdr.Get("Content-Type"))
		assert.Equal(t, `filename="comfyreal_test_00001_.png"`, hdr.Get("Content-Disposition"))
		assert.True(t, strings.HasPrefix(img, "\x89PNG\r\n\x1a\n"))
	})
}

// TestGoldenInvalidPrompts checks the exact 400 bodies of transcript (c)
// and that rejected prompts consume numbers and send nothing on the socket.
func TestGoldenInvalidPrompts(t *testing.T) {
	b, err := os.ReadFile("testdata/c_invalid.json")
	require.NoError(t, err)
	var cases []struct {
		Request  string `json:"request"`
		Status   int    `json:"status"`
		Response string `json:"response"`
	}
	require.NoError(t, json.Unmarshal(b, &cases))
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		for _, c := range cases {
			code, body := post(t, s, "/prompt", c.Request)
			assert.Equal(t, c.Status, code, c.Request)
			if strings.Contains(c.Response, "exception_during_validation") {
				// The traceback lines are the real server's; compare the rest.
				assert.Equal(t, cutTraceback(c.Response), cutTraceback(body))
			} else {
				assert.Equal(t, c.Response, body, c.Request)
			}
		}
		code, body := post(t, s, "/prompt", prompt(`{"1":{"class_type":"EmptyImage","inputs":{"width":8,"height":8,"batch_size":1,"color":0}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0]}}}`, ""))
		require.Equal(t, 200, code)
		assert.Contains(t, body, `"number": 7,`, "rejected prompts consumed numbers")
		// The first frame after the rejected posts is the status of the
		// accepted prompt: the rejected ones sent nothing.
		assert.Equal(t, `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 1}}}}`, ws.next())
		ws.untilDone()
		ps := s.Prompts()
		require.Len(t, ps, 8)
		assert.Equal(t, 400, ps[0].Status)
		assert.Equal(t, 200, ps[7].Status)
		assert.Equal(t, cid, ps[7].ClientID)
		assert.Equal(t, float64(7), ps[7].Number)
	})
}

func cutTraceback(s string) string {
	if i := strings.Index(s, `"traceback"`); i >= 0 {
		j := strings.Index(s[i:], "]")
		return s[:i] + s[i+j:]
	}
	return s
}

// TestGoldenInterrupt reproduces transcript (d): a targeted interrupt of a
// prompt that is not running does nothing, the targeted interrupt of the
// running one stops it at the next node start, and the queued prompt runs.
func TestGoldenInterrupt(t *testing.T) {
	blur := comfytest.Builtins()["ImageBlur"]
	blur.Duration = 10 * time.Second
	empty := comfytest.Builtins()["EmptyImage"]
	empty.Duration = 4 * time.Millisecond
	opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"ImageBlur": blur, "EmptyImage": empty}}
	inMemory(t, opts, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		slow := `{"1":{"class_type":"EmptyImage","inputs":{"width":256,"height":256,"batch_size":1,"color":12345}},"2":{"class_type":"ImageBlur","inputs":{"image":["1",0],"blur_radius":31,"sigma":10}},"3":{"class_type":"ImageBlur","inputs":{"image":["2",0],"blur_radius":31,"sigma":9}},"4":{"class_type":"ImageBlur","inputs":{"image":["3",0],"blur_radius":31,"sigma":8}},"5":{"class_type":"ImageBlur","inputs":{"image":["4",0],"blur_radius":31,"sigma":7}},"6":{"class_type":"SaveImage","inputs":{"images":["5",0],"filename_prefix":"slow"}}}`
		after := `{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":48,"batch_size":1,"color":255}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"after_interrupt"}},"4":{"class_type":"PreviewImage","inputs":{"images":["2",0]}}}`
		_, b1 := post(t, s, "/prompt", prompt(slow, ""))
		p1 := promptIDOf(t, b1)
		synctest.Wait()
		_, b2 := post(t, s, "/prompt", prompt(after, ""))
		p2 := promptIDOf(t, b2)
		_, q, _ := get(t, s, "/queue")
		assert.Contains(t, q, `"sigma": 10.0`, "FLOAT widgets are stored coerced")
		assert.Contains(t, q, `["6"]]], "queue_pending": [[1, "`+p2)
		_, gp, _ := get(t, s, "/prompt")
		assert.Equal(t, `{"exec_info": {"queue_remaining": 2}}`, gp)
		code, body := post(t, s, "/interrupt", `{"prompt_id":"`+p2+`"}`)
		assert.Equal(t, 200, code)
		assert.Empty(t, body)
		time.Sleep(time.Second) // fake time: node 2 is running
		post(t, s, "/interrupt", `{"prompt_id":"`+p1+`"}`)
		got := ws.untilDone()
		got = append(got, ws.untilDone()...)
		assert.Equal(t, normalize(golden(t, "d_0")), normalize(got))
		assert.Equal(t, []string{p2, p1}, s.Interrupts())

		_, h, _ := get(t, s, "/history/"+p1)
		assert.Contains(t, h, `"outputs": {}, "status": {"status_str": "error", "completed": false, "messages": [["execution_start"`)
		assert.Contains(t, h, `["execution_interrupted", {"prompt_id": "`+p1+`", "node_id": "3", "node_type": "ImageBlur", "executed": ["2", "1"], "timestamp": `)
	})
}

// TestReconnectSameClientID reproduces (d3): reconnecting mid-run with the
// same clientId gives status + executing{node} (no prompt_id); deleting the
// only pending prompt broadcasts status twice; a global interrupt stops the
// running prompt at the next node.
func TestReconnectSameClientID(t *testing.T) {
	blur := comfytest.Builtins()["ImageBlur"]
	blur.Duration = 5 * time.Second
	opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"ImageBlur": blur}}
	inMemory(t, opts, func(t *testing.T, s *comfytest.Server) {
		ws := dial(t, s, "?clientId="+cid)
		ws.next()
		g := `{"1":{"class_type":"EmptyImage","inputs":{"width":192,"height":192,"batch_size":1,"color":777}},"2":{"class_type":"ImageBlur","inputs":{"image":["1",0],"blur_radius":31,"sigma":10}},"3":{"class_type":"ImageBlur","inputs":{"image":["2",0],"blur_radius":31,"sigma":9}},"4":{"class_type":"PreviewImage","inputs":{"images":["3",0]}}}`
		_, b1 := post(t, s, "/prompt", prompt(g, ""))
		p1 := promptIDOf(t, b1)
		_, b2 := post(t, s, "/prompt", prompt(graphA, ""))
		p2 := promptIDOf(t, b2)
		synctest.Wait()
		require.NoError(t, ws.c.CloseNow())
		synctest.Wait() // the server has handled the close
		ws2 := dial(t, s, "?clientId="+cid)
		assert.Equal(t, `{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 2}}, "sid": "`+cid+`"}}`, ws2.next())
		assert.Equal(t, `{"type": "executing", "data": {"node": "2"}}`, ws2.next())
		post(t, s, "/queue", `{"delete":["`+p2+`"]}`)
		post(t, s, "/interrupt", `{}`)
		got := normalize(ws2.untilDone())
		want := normalize(golden(t, "d3_0")[len(golden(t, "d3_0"))-8:])
		assert.Equal(t, want, got)
		_, h, _ := get(t, s, "/history/"+p2)
		assert.Equal(t, "{}", h, "a deleted pending prompt never runs")
		_, h, _ = get(t, s, "/history/"+p1)
		assert.Contains(t, h, `"status_str": "error", "completed": false`)
		assert.Equal(t, []string{cid, cid}, s.ClientIDs())
		assert.Equal(t, []string{""}, s.Interrupts())
	})
}

// TestReconnectPitfall documents the real server's bug: when an OLD socket of
// a clientId closes after a newer one registered, the mapping is removed and
// the new socket receives nothing at all.
func TestReconnectPitfall(t *testing.T) {
	inMemory(t, nil, func(t *testing.T, s *comfytest.Server) {
		old := dial(t, s, "?clientId="+cid)
		old.next()
		fresh := dial(t, s, "?clientId="+cid)
		fresh.next()
		require.NoError(t, old.c.CloseNow())
		synctest.Wait()
		code, _ := post(t, s, "/prompt", prompt(graphA, ""))
		require.Equal(t, 200, code)
		synctest.Wait()
		_, err := fresh.read(time.Second)
		assert.Error(t, err, "the new socket lost its registration")
	})
}

// TestRouting checks (a4) and (a5): a bystander only gets status; a prompt
// without client_id sends only status and progress_state, to everybody.
func TestRouting(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		const other = "49aaa94fa9c240cca1c93dc98e2d4c26"
		sub := dial(t, s, "?clientId="+cid)
		by := dial(t, s, "?clientId="+other)
		sub.next()
		by.next()
		g := `{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":48,"batch_size":1,"color":8421504}},"2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},"3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"two_clients"}},"4":{"class_type":"PreviewImage","inputs":{"images":["2",0]}}}`
		post(t, s, "/prompt", prompt(g, ""))
		assert.Equal(t, normalize(golden(t, "a4_0")[1:]), normalize(sub.untilDone()))
		want := golden(t, "a4_1")[1:]
		for _, w := range want {
			assert.Equal(t, w, by.next())
		}

		g5 := strings.ReplaceAll(strings.ReplaceAll(g, "two_clients", "no_client_id"), "8421504", "4210752")
		code, body := post(t, s, "/prompt", `{"prompt":`+g5+`}`)
		require.Equal(t, 200, code)
		p := promptIDOf(t, body)
		want5 := normalize(golden(t, "a5_0")[1:])
		for _, c := range []*wsc{sub, by} {
			var got []string
			for len(got) < len(want5) {
				got = append(got, c.next())
			}
			assert.Equal(t, want5, normalize(got))
		}
		_, h, _ := get(t, s, "/history/"+p)
		assert.Contains(t, h, `"images": ["2", 0]}}}, {}, ["4", "3"]]`, "extra_data is {} without client_id")
	})
}

// TestPreviewFrames checks (a2)/(a3)-style binary frames from the fake
// sampler: type 1 after progress for legacy sockets, type 4 before progress
// for sockets that negotiated supports_preview_metadata.
func TestPreviewFrames(t *testing.T) {
	forModes(t, nil, func(t *testing.T, s *comfytest.Server) {
		legacy := dial(t, s, "?clientId=legacy")
		legacy.next()
		modern := dial(t, s, "?clientId=modern")
		require.NoError(t, modern.c.Write(t.Context(), 1, []byte(`{"type": "feature_flags", "data": {"supports_preview_metadata": true}}`)))
		modern.next()
		assert.Equal(t, `{"type": "feature_flags", "data": {"supports_preview_metadata": true, "max_upload_size": 104857600}}`, modern.next())

		for i, c := range []struct {
			w        *wsc
			id       string
			wantType string
		}{{legacy, "legacy", "00000001"}, {modern, "modern", "00000004"}} {
			// A different seed per run, or the second run would be cached.
			wf := strings.Replace(string(comfytest.WorkflowSampler), `"seed":42`, `"seed":`+fmt.Sprint(i+100), 1)
			code, _ := post(t, s, "/prompt", `{"prompt":`+wf+`,"client_id":"`+c.id+`"}`)
			require.Equal(t, 200, code)
			msgs := c.w.untilDone()
			var seq []string
			for _, m := range msgs {
				switch {
				case strings.HasPrefix(m, "BINARY "):
					seq = append(seq, "bin"+m[7:15])
				case strings.Contains(m, `"type": "progress",`):
					seq = append(seq, "progress")
				}
			}
			var want []string
			for i := 0; i < 4; i++ {
				if c.wantType == "00000001" {
					want = append(want, "progress", "bin00000001")
				} else {
					want = append(want, "bin00000004", "progress")
				}
			}
			assert.Equal(t, want, seq, c.id)
			assert.Contains(t, strings.Join(msgs, "\n"), `{"type": "progress", "data": {"value": 4, "max": 4, "prompt_id": "`)
		}
	})
}
