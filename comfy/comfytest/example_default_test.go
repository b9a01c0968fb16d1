package comfytest_test

import (
	"context"
	"fmt"
	"image/png"
	"log/slog"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// ExampleDefaultWorkflow runs ComfyUI's default text-to-image workflow,
// unmodified, on the fake through a comfy.Client, counting the sampler's
// progress and previews, then downloads the image it saved.
func ExampleDefaultWorkflow() {
	srv := comfytest.NewServer(nil)
	defer srv.Close()
	ctx := context.Background()
	c, err := comfy.NewClient(srv.URL, &comfy.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer c.Close(ctx)

	wf, err := comfy.ParseWorkflow(comfytest.DefaultWorkflow())
	if err != nil {
		panic(err)
	}
	steps, previews := 0, 0
	res, err := c.Run(ctx, wf, &comfy.RunOptions{OnMessage: func(m comfy.Message) {
		switch m.(type) {
		case *comfy.Progress:
			steps++
		case *comfy.Preview:
			previews++
		}
	}})
	if err != nil {
		panic(err)
	}
	fmt.Println("progress:", steps, "previews:", previews)

	for _, f := range res.Outputs["9"].Files() {
		v, err := c.View(ctx, f, nil)
		if err != nil {
			panic(err)
		}
		img, err := png.Decode(v.Body)
		v.Body.Close()
		if err != nil {
			panic(err)
		}
		fmt.Println(f.Filename, img.Bounds().Dx(), "x", img.Bounds().Dy())
	}
	// Output:
	// progress: 20 previews: 20
	// ComfyUI_00001_.png 512 x 512
}
