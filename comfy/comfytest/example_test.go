package comfytest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// Example submits a workflow with plain net/http, waits for the end marker
// on the WebSocket and reads the history entry.
func Example() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws?clientId=example", nil)
	if err != nil {
		panic(err)
	}
	defer ws.CloseNow()
	// The status greeting: from now on the server sends this socket the
	// messages of client "example" (a prompt posted before could end
	// before the server holds the socket).
	if _, _, err := ws.Read(ctx); err != nil {
		panic(err)
	}

	const id = "0b196380-b656-4307-897e-964c2ebe5b3c"
	body := `{"prompt": ` + string(comfytest.WorkflowOK) + `, "client_id": "example", "prompt_id": "` + id + `"}`
	resp, err := srv.Client().Post(srv.URL+"/prompt", "application/json", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	// executing{node: null} for our prompt means the history is written.
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			panic(err)
		}
		var m struct {
			Type string
			Data struct {
				Node     *string
				PromptID string `json:"prompt_id"`
			}
		}
		_ = json.Unmarshal(msg, &m)
		if m.Type == "executing" && m.Data.Node == nil && m.Data.PromptID == id {
			break
		}
	}

	r, err := srv.Client().Get(srv.URL + "/history/" + id)
	if err != nil {
		panic(err)
	}
	defer r.Body.Close()
	var hist map[string]struct {
		Outputs map[string]struct {
			Images []struct{ Filename, Type string }
		}
		Status struct {
			StatusStr string `json:"status_str"`
		}
	}
	_ = json.NewDecoder(r.Body).Decode(&hist)
	img := hist[id].Outputs["3"].Images[0]
	fmt.Println(hist[id].Status.StatusStr, img.Filename, img.Type)
	fmt.Println(len(srv.Prompts()), srv.Prompts()[0].ClientID)
	// Output:
	// success comfytest_00001_.png output
	// 1 example
}
