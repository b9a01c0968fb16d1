package failover_test

import (
	"fmt"
	"net/http"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
)

func Example() {
	f, err := failover.New(&failover.Config{
		OnEvent: func(ev failover.Event) {
			fmt.Printf("%s %s/%s\n", ev.Kind, ev.Key.Backend, ev.Key.Workflow)
		},
	})
	if err != nil {
		panic(err)
	}
	defer f.Close()

	k := failover.Key{Backend: "gpu-1", Workflow: "3f2a..."}
	// The backend answered 503: its fault. The pair is blocked.
	class := f.RecordFailure(k, &comfy.HTTPError{Method: "POST", Path: "/prompt", StatusCode: http.StatusServiceUnavailable})
	fmt.Println(class, f.Allowed(k))
	// A node error is the workflow's own: nobody is blocked.
	fmt.Println(f.RecordFailure(failover.Key{Backend: "gpu-2", Workflow: "3f2a..."}, &comfy.ExecutionError{NodeID: "7"}))
	// Output:
	// client:blocked_workflow gpu-1/3f2a...
	// backend false
	// workflow
}
