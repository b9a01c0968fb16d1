package comfytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

// newClient is a comfy.Client for s, closed when the test ends.
func newClient(t *testing.T, s *comfytest.Server) *comfy.Client {
	t.Helper()
	c, err := comfy.NewClient(s.URL, &comfy.ClientOptions{HTTPClient: s.Client(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// defaultWF is DefaultWorkflow with some inputs set: {node, input, value}.
func defaultWF(t *testing.T, set ...[3]any) comfy.Workflow {
	t.Helper()
	wf, err := comfy.ParseWorkflow(comfytest.DefaultWorkflow())
	require.NoError(t, err)
	for _, s := range set {
		require.NoError(t, wf.SetInput(s[0].(string), s[1].(string), s[2]))
	}
	return wf
}

// fetchImage downloads a file through /view and decodes it.
func fetchImage(t *testing.T, c *comfy.Client, ref comfy.FileRef) image.Image {
	t.Helper()
	v, err := c.View(t.Context(), ref, nil)
	require.NoError(t, err)
	defer v.Body.Close()
	data, err := io.ReadAll(v.Body)
	require.NoError(t, err)
	img, _, err := image.Decode(bytes.NewReader(data))
	require.NoError(t, err, ref.Filename)
	return img
}

// solid returns img's colour when every pixel has it, or fails.
func solid(t *testing.T, img image.Image) color.NRGBA {
	t.Helper()
	b := img.Bounds()
	c := color.NRGBAModel.Convert(img.At(b.Min.X, b.Min.Y)).(color.NRGBA)
	if rgba, ok := img.(*image.RGBA); ok { // what the fake saves: fast
		want := []byte{c.R, c.G, c.B, 255}
		for i := 0; i < len(rgba.Pix); i += 4 {
			if !bytes.Equal(rgba.Pix[i:i+4], want) {
				require.Equal(t, want, rgba.Pix[i:i+4], "pixel %d", i/4)
			}
		}
		return c
	}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if got := color.NRGBAModel.Convert(img.At(x, y)); got != c {
				require.Equal(t, c, got, "pixel %d,%d", x, y)
			}
		}
	}
	return c
}

type sampling struct {
	progress []float64 // values of node "3"'s progress messages
	max      float64
	previews []*comfy.Preview
}

func (s *sampling) onMessage(m comfy.Message) {
	switch m := m.(type) {
	case *comfy.Progress:
		if m.Node == "3" {
			s.progress = append(s.progress, m.Value)
			s.max = m.Max
		}
	case *comfy.Preview:
		s.previews = append(s.previews, m)
	}
}

// runDefault runs wf through c and returns the result and what sampling
// sent.
func runDefault(t *testing.T, c *comfy.Client, wf comfy.Workflow) (*comfy.Result, *sampling) {
	t.Helper()
	var got sampling
	res, err := c.Run(t.Context(), wf, &comfy.RunOptions{OnMessage: got.onMessage})
	require.NoError(t, err)
	require.Zero(t, res.DroppedMessages)
	return res, &got
}

// TestDefaultWorkflow runs ComfyUI's default workflow, unmodified, on a
// default server through a real client: KSampler reports its 20 steps,
// each with a preview, and SaveImage writes a 512x512 PNG whose colour
// comes from the seed. A batch gives one PNG per item of the requested
// size, and another seed other pixels.
func TestDefaultWorkflow(t *testing.T) {
	t.Parallel()
	s := comfytest.NewServer(nil)
	defer s.Close()
	c := newClient(t, s)

	res, got := runDefault(t, c, defaultWF(t))
	want := make([]float64, 20)
	for i := range want {
		want[i] = float64(i + 1)
	}
	assert.Equal(t, want, got.progress, "one progress message per step")
	assert.Equal(t, float64(20), got.max)
	require.Len(t, got.previews, 20, "one preview per step")
	prev, err := jpeg.Decode(bytes.NewReader(got.previews[0].Image))
	require.NoError(t, err, "previews are real JPEGs")
	assert.Equal(t, image.Rect(0, 0, 64, 64), prev.Bounds(), "the latent's size, 512/8")
	assert.Equal(t, "image/jpeg", got.previews[0].MIMEType)

	files := res.Outputs["9"].Files()
	require.Equal(t, []comfy.FileRef{{Filename: "ComfyUI_00001_.png", Type: "output"}}, files)
	img := fetchImage(t, c, files[0])
	assert.Equal(t, image.Rect(0, 0, 512, 512), img.Bounds())
	first := solid(t, img)
	pc := color.NRGBAModel.Convert(prev.At(32, 32)).(color.NRGBA)
	assert.InDelta(t, float64(first.R), float64(pc.R), 8, "the preview shows the image's colour")
	assert.InDelta(t, float64(first.G), float64(pc.G), 8)
	assert.InDelta(t, float64(first.B), float64(pc.B), 8)

	// Unchanged, it is a fully cached run, as on a real server.
	res, got = runDefault(t, c, defaultWF(t))
	assert.ElementsMatch(t, []string{"3", "4", "5", "6", "7", "8", "9"}, res.Cached)
	assert.Empty(t, got.progress)
	assert.Equal(t, files, res.Outputs["9"].Files(), "the same file")

	// Another seed, size and batch: three PNGs of 768x512, all different.
	res, got = runDefault(t, c, defaultWF(t, [3]any{"3", "seed", 7}, [3]any{"5", "width", 768}, [3]any{"5", "batch_size", 3}, [3]any{"3", "steps", 4}))
	assert.Len(t, got.progress, 4)
	assert.Len(t, got.previews, 4)
	files = res.Outputs["9"].Files()
	require.Len(t, files, 3)
	seen := map[color.NRGBA]bool{first: true}
	for i, f := range files {
		assert.Equal(t, []string{"ComfyUI_00002_.png", "ComfyUI_00003_.png", "ComfyUI_00004_.png"}[i], f.Filename)
		img := fetchImage(t, c, f)
		assert.Equal(t, image.Rect(0, 0, 768, 512), img.Bounds())
		col := solid(t, img)
		assert.False(t, seen[col], "item %d: a colour of its own", i)
		seen[col] = true
	}

	// The same inputs on another server give the same image.
	s2 := comfytest.NewServer(nil)
	defer s2.Close()
	c2 := newClient(t, s2)
	res, _ = runDefault(t, c2, defaultWF(t))
	assert.Equal(t, first, solid(t, fetchImage(t, c2, res.Outputs["9"].Files()[0])), "the colour depends on the inputs only")

	// A size that is not a multiple of 8 decodes as the real latent does.
	res, _ = runDefault(t, c2, defaultWF(t, [3]any{"5", "width", 100}, [3]any{"5", "height", 60}))
	assert.Equal(t, image.Rect(0, 0, 96, 56), fetchImage(t, c2, res.Outputs["9"].Files()[0]).Bounds())
}

// TestDefaultWorkflowSeeds: every seed gives its own image.
func TestDefaultWorkflowSeeds(t *testing.T) {
	t.Parallel()
	s := comfytest.NewServer(nil)
	defer s.Close()
	c := newClient(t, s)
	seen := map[color.NRGBA]uint64{}
	for _, seed := range []uint64{0, 1, 2, 3, 156680208700286, 1<<63 + 5, 18446744073709551615} {
		res, _ := runDefault(t, c, defaultWF(t, [3]any{"3", "seed", seed}, [3]any{"5", "width", 64}, [3]any{"5", "height", 64}, [3]any{"3", "steps", 1}))
		col := solid(t, fetchImage(t, c, res.Outputs["9"].Files()[0]))
		if other, dup := seen[col]; dup {
			t.Errorf("seeds %d and %d give the same colour %v", other, seed, col)
		}
		seen[col] = seed
	}
}

// TestDefaultWorkflowValidation: the nodes' inputs are validated as the
// real server validates them.
func TestDefaultWorkflowValidation(t *testing.T) {
	t.Parallel()
	s := comfytest.NewServer(nil)
	defer s.Close()
	for _, c := range []struct {
		node, input string
		value       any
		want        string
	}{
		{"3", "sampler_name", "euler_fast", `"type": "value_not_in_list", "message": "Value not in list", "details": "sampler_name: 'euler_fast' not in (list of length 42)"`},
		{"3", "scheduler", "linear", `"details": "scheduler: 'linear' not in ['simple', 'sgm_uniform', 'karras', 'exponential', 'ddim_uniform', 'beta', 'normal', 'linear_quadratic', 'kl_optimal']"`},
		{"3", "denoise", 1.5, `"type": "value_bigger_than_max", "message": "Value 1.5 bigger than max of 1.0", "details": "denoise"`},
		{"3", "steps", 0, `"type": "value_smaller_than_min", "message": "Value 0 smaller than min of 1", "details": "steps"`},
		{"3", "cfg", "high", `"type": "invalid_input_type", "message": "Failed to convert an input value to a FLOAT value", "details": "cfg, high, could not convert string to float: 'high'"`},
		{"3", "positive", []any{"4", 1}, `"type": "return_type_mismatch", "message": "Return type mismatch between linked nodes", "details": "positive, received_type(CLIP) mismatch input_type(CONDITIONING)"`},
		{"5", "width", 8, `"message": "Value 8 smaller than min of 16", "details": "width"`},
		{"5", "batch_size", 4097, `"message": "Value 4097 bigger than max of 4096", "details": "batch_size"`},
		{"4", "ckpt_name", "v1-5-pruned-emaonly.ckpt", `"details": "ckpt_name: 'v1-5-pruned-emaonly.ckpt' not in ['fake_sd15.safetensors', 'fake_sdxl.safetensors', 'fake_flux_dev.safetensors', 'v1-5-pruned-emaonly-fp16.safetensors']"`},
		{"8", "vae", []any{"4", 0}, `"details": "vae, received_type(MODEL) mismatch input_type(VAE)"`},
	} {
		wf := defaultWF(t, [3]any{c.node, c.input, c.value})
		b, err := json.Marshal(wf)
		require.NoError(t, err)
		code, body := post(t, s, "/prompt", prompt(string(b), ""))
		assert.Equal(t, 400, code, "%s.%s", c.node, c.input)
		assert.Contains(t, body, c.want)
	}
}

// TestKSamplerOverride: a NodeBehavior given for KSampler wins over its
// steps input, and Previews -1 turns the previews off; its Duration runs
// on the clock, spread over the steps.
func TestKSamplerOverride(t *testing.T) {
	t.Parallel()
	ks := comfytest.Builtins()["KSampler"]
	ks.ProgressSteps = 3
	ks.Previews = -1
	ks.Duration = 6 * time.Second
	synctest.Test(t, func(t *testing.T) {
		s := comfytest.NewInMemoryServer(&comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{"KSampler": ks}})
		defer s.Close()
		c := newClient(t, s)
		start := time.Now()
		res, got := runDefault(t, c, defaultWF(t))
		assert.Equal(t, 6*time.Second, time.Since(start))
		assert.Equal(t, []float64{1, 2, 3}, got.progress)
		assert.Empty(t, got.previews)
		assert.Len(t, res.Outputs["9"].Files(), 1, "the sampler still samples")
	})
}

// testImage is a w x h image with a different colour in every pixel.
func testImage(w, h int, alpha bool) *image.NRGBA {
	m := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			a := uint8(255)
			if alpha {
				a = uint8(x * 255 / max(w-1, 1))
			}
			m.SetNRGBA(x, y, color.NRGBA{R: uint8(x * 7), G: uint8(y * 11), B: uint8(x*y + 3), A: a})
		}
	}
	return m
}

func encode(t *testing.T, enc func(io.Writer, image.Image) error, m image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, enc(&b, m))
	return b.Bytes()
}

// assertPixels checks got has want's size and RGB (alpha ignored: saved
// images are RGB).
func assertPixels(t *testing.T, want, got image.Image) {
	t.Helper()
	require.Equal(t, want.Bounds().Size(), got.Bounds().Size())
	wb, gb := want.Bounds(), got.Bounds()
	for y := range wb.Dy() {
		for x := range wb.Dx() {
			w := color.NRGBAModel.Convert(want.At(wb.Min.X+x, wb.Min.Y+y)).(color.NRGBA)
			g := color.NRGBAModel.Convert(got.At(gb.Min.X+x, gb.Min.Y+y)).(color.NRGBA)
			if w.R != g.R || w.G != g.G || w.B != g.B {
				require.Equal(t, w, g, "pixel %d,%d", x, y)
			}
		}
	}
}

// loadAndSave runs LoadImage(name) -> SaveImage, and MaskToImage of its
// mask -> SaveImage, and returns the saved images and the masks.
func loadAndSave(t *testing.T, c *comfy.Client, name string) (images, masks []image.Image) {
	t.Helper()
	wf, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"` + name + `"}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"img"}},"3":{"class_type":"MaskToImage","inputs":{"mask":["1",1]}},"4":{"class_type":"SaveImage","inputs":{"images":["3",0],"filename_prefix":"mask"}}}`))
	require.NoError(t, err)
	res, err := c.Run(t.Context(), wf, nil)
	require.NoError(t, err)
	for _, f := range res.Outputs["2"].Files() {
		images = append(images, fetchImage(t, c, f))
	}
	for _, f := range res.Outputs["4"].Files() {
		masks = append(masks, fetchImage(t, c, f))
	}
	return images, masks
}

// TestLoadImageRoundTrip: LoadImage returns the uploaded file's pixels, so
// LoadImage -> SaveImage gives back the upload (exactly for PNG; for JPEG
// as the decoder reads it), with the mask ComfyUI makes: 1 - alpha, or a
// 64x64 zero mask for an image without alpha. A GIF's frames are a batch.
// An upload overwritten under the same name is read again, not served
// from the cache.
func TestLoadImageRoundTrip(t *testing.T) {
	t.Parallel()
	s := comfytest.NewServer(nil)
	defer s.Close()
	c := newClient(t, s)
	upload := func(name string, data []byte, overwrite bool) string {
		ref, err := c.UploadImage(t.Context(), bytes.NewReader(data), name, &comfy.UploadOptions{Overwrite: overwrite})
		require.NoError(t, err)
		return ref.Filename
	}

	opaque := testImage(37, 23, false)
	imgs, masks := loadAndSave(t, c, upload("opaque.png", encode(t, png.Encode, opaque), false))
	require.Len(t, imgs, 1)
	assertPixels(t, opaque, imgs[0])
	require.Len(t, masks, 1)
	assert.Equal(t, image.Rect(0, 0, 64, 64), masks[0].Bounds())
	assert.Equal(t, color.NRGBA{A: 255}, solid(t, masks[0]), "no alpha: a zero mask")

	translucent := testImage(40, 30, true)
	imgs, masks = loadAndSave(t, c, upload("alpha.png", encode(t, png.Encode, translucent), false))
	assertPixels(t, translucent, imgs[0])
	wantMask := image.NewGray(translucent.Rect)
	for y := range 30 {
		for x := range 40 {
			wantMask.SetGray(x, y, color.Gray{Y: 255 - translucent.NRGBAAt(x, y).A})
		}
	}
	assertPixels(t, wantMask, masks[0])

	jpg := encode(t, func(w io.Writer, m image.Image) error { return jpeg.Encode(w, m, &jpeg.Options{Quality: 90}) }, opaque)
	decoded, err := jpeg.Decode(bytes.NewReader(jpg))
	require.NoError(t, err)
	imgs, _ = loadAndSave(t, c, "sub/"+func() string {
		ref, err := c.UploadImage(t.Context(), bytes.NewReader(jpg), "photo.jpg", &comfy.UploadOptions{Subfolder: "sub"})
		require.NoError(t, err)
		return ref.Filename
	}())
	assertPixels(t, decoded, imgs[0])

	pal := color.Palette{color.RGBA{255, 0, 0, 255}, color.RGBA{0, 0, 255, 255}}
	anim := &gif.GIF{Image: []*image.Paletted{image.NewPaletted(image.Rect(0, 0, 8, 6), pal), image.NewPaletted(image.Rect(0, 0, 8, 6), pal)}, Delay: []int{10, 10}}
	for i := range anim.Image[1].Pix {
		anim.Image[1].Pix[i] = 1
	}
	imgs, _ = loadAndSave(t, c, upload("anim.gif", encode(t, func(w io.Writer, _ image.Image) error { return gif.EncodeAll(w, anim) }, nil), false))
	require.Len(t, imgs, 2, "one image per frame")
	assert.Equal(t, color.NRGBA{R: 255, A: 255}, solid(t, imgs[0]))
	assert.Equal(t, color.NRGBA{B: 255, A: 255}, solid(t, imgs[1]))

	// Overwritten: the new pixels, not the cached run's.
	other := testImage(5, 5, false)
	imgs, _ = loadAndSave(t, c, upload("opaque.png", encode(t, png.Encode, other), true))
	assertPixels(t, other, imgs[0])
}

// TestLoadImageUndecodable: a file LoadImage cannot decode fails the node
// with an execution_error shaped like Pillow's.
func TestLoadImageUndecodable(t *testing.T) {
	t.Parallel()
	s := comfytest.NewServer(nil)
	defer s.Close()
	c := newClient(t, s)
	pngData := encode(t, png.Encode, testImage(64, 64, false))
	for _, tc := range []struct {
		name      string
		data      []byte
		typ, msg  string
		lastFrame string
	}{
		{"notes.png", []byte("these are not pixels"), "PIL.UnidentifiedImageError", "cannot identify image file '<comfyui>/input/notes.png'\n", "raise UnidentifiedImageError(msg)"},
		{"cut.png", pngData[:len(pngData)/2], "OSError", "image file is truncated\n", "raise _get_oserror(err_code, encoder=False)"},
	} {
		_, err := c.UploadImage(t.Context(), bytes.NewReader(tc.data), tc.name, nil)
		require.NoError(t, err)
		wf, err := comfy.ParseWorkflow([]byte(`{"1":{"class_type":"LoadImage","inputs":{"image":"` + tc.name + `"}},"2":{"class_type":"SaveImage","inputs":{"images":["1",0],"filename_prefix":"x"}}}`))
		require.NoError(t, err)
		_, err = c.Run(t.Context(), wf, nil)
		var ee *comfy.ExecutionError
		require.ErrorAs(t, err, &ee, tc.name)
		assert.Equal(t, "1", ee.NodeID)
		assert.Equal(t, "LoadImage", ee.NodeType)
		assert.Equal(t, tc.typ, ee.ExceptionType)
		assert.Equal(t, tc.msg, ee.ExceptionMessage)
		require.NotEmpty(t, ee.Traceback)
		assert.True(t, strings.Contains(ee.Traceback[len(ee.Traceback)-1], tc.lastFrame), ee.Traceback[len(ee.Traceback)-1])
		assert.Equal(t, map[string]json.RawMessage{"image": json.RawMessage(`["` + tc.name + `"]`)}, ee.CurrentInputs)
	}
}
