package comfy_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"log"
	"log/slog"
	"net/http"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// ExampleClient_cloud runs a workflow on Comfy Cloud: one option, APIKey,
// configures the client (routes under /api, the key on every request, the
// WebSocket at /ws with the key as its token, results from
// /api/jobs/{id}). Here the Cloud is comfytest's fake; for the real one,
// the URL is comfy.CloudURL and the key comes from platform.comfy.org.
func ExampleClient_cloud() {
	const key = "comfyui-0123456789abcdef" // never logged, never in an error
	srv := comfytest.NewCloudServer(key, nil)
	defer srv.Close()

	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{APIKey: key, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	// Inputs are content-addressed on Cloud: reference the returned name.
	var img bytes.Buffer
	_ = png.Encode(&img, solidImage(8, 8))
	in, err := c.UploadImage(ctx, &img, "photo.png", nil)
	if err != nil {
		log.Fatal(err)
	}
	wf, err := comfy.ParseWorkflow([]byte(`{
		"1": {"class_type": "LoadImage", "inputs": {"image": "` + in.Filename + `"}},
		"2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
		"3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "cloud"}}}`))
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Run(ctx, wf, nil)
	if err != nil {
		log.Fatal(err)
	}
	// /api/view redirects to a signed storage URL, fetched without the key.
	for _, f := range res.Files() {
		v, err := c.View(ctx, f, nil)
		if err != nil {
			log.Fatal(err)
		}
		out, err := png.Decode(v.Body)
		v.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(f.Filename, out.Bounds().Dx(), "px wide")
	}
	fmt.Println("storage saw the key:", srv.StorageSawAPIKey())

	// A wrong key is refused with a typed error, which does not hold it.
	bad, _ := comfy.NewClient(srv.URL, &comfy.ClientOptions{APIKey: "comfyui-wrong", Logger: slog.New(slog.DiscardHandler)})
	defer bad.Close(ctx)
	_, err = bad.Run(ctx, wf, nil)
	fmt.Println(comfy.StatusCode(err) == http.StatusUnauthorized)
	// Output:
	// cloud_00001_.png 8 px wide
	// storage saw the key: false
	// true
}
