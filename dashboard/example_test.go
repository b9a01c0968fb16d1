package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dashboard"
	"github.com/comfypool/comfypool/pool"
)

// Example mounts the dashboard of a pool under /dashboard/ in a service,
// with actions for requests that carry the operator's token, and reads its
// overview as the page does.
func Example() {
	srv := comfytest.NewServer(nil) // a fake ComfyUI
	defer srv.Close()
	quiet := slog.New(slog.DiscardHandler)
	p, err := pool.New(&pool.Config{
		Backends: []pool.BackendConfig{{Name: "gpu-1", URL: srv.URL, Client: &comfy.ClientOptions{Logger: quiet}}},
		Logger:   quiet,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)
	if _, err := p.WaitConnected(ctx, 1); err != nil {
		panic(err)
	}

	h, err := dashboard.New(p, &dashboard.Config{
		Title: "render farm",
		Authorize: func(r *http.Request, a dashboard.Action) error {
			if r.Header.Get("Authorization") != "Bearer operator-token" { // the service's own check
				return errors.New("operators only")
			}
			return nil
		},
		Logger: quiet,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", h))
	web := httptest.NewServer(mux)
	defer web.Close()

	resp, err := http.Get(web.URL + "/dashboard/api/overview")
	if err != nil {
		panic(err)
	}
	var overview struct {
		Backends []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"backends"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&overview)
	resp.Body.Close()
	for _, b := range overview.Backends {
		fmt.Println(b.Name, b.State)
	}

	pause := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, web.URL+"/dashboard/api/pause", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println("pause without the token:", pause("guess"))
	fmt.Println("pause with it:", pause("operator-token"))
	paused, _ := p.Paused(ctx)
	fmt.Println("paused:", paused)
	// Output:
	// gpu-1 connected
	// pause without the token: 403
	// pause with it: 204
	// paused: [all]
}
