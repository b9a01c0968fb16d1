package comfytest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"image"
	"image/color"
	"image/draw"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"path"
	"strings"
)

// loadImageFile resolves LoadImage's image input to its stored key and
// the path the real server would open.
func loadImageFile(name string) (fileKey, string) {
	k := splitAnnotated(name, "input")
	return k, path.Join("<comfyui>", k.typ, k.sub, k.name)
}

// loadImageChanged is LoadImage.IS_CHANGED: the sha256 of the file, so a
// file overwritten under the same name is read again instead of served
// from the cache. Caller holds s.mu.
func loadImageChanged(s *Server, in omap) string {
	v, _ := in.get("image")
	name, _ := v.(string)
	k, _ := loadImageFile(name)
	data, ok := s.inputFileLocked(k)
	if !ok {
		return ""
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// loadImage runs LoadImage: it reads the uploaded file it names, as
// nodes.LoadImage does with Pillow. PNG, JPEG and GIF (every frame, a
// batch) decode with the standard library; anything else fails as Pillow
// fails on a file it cannot identify. The IMAGE output is the frames as
// RGB; the MASK output is 1 - alpha for images with an alpha channel
// (stored as grey pixels, 255 - alpha), and a 64x64 zero mask per frame
// otherwise, as the real node makes it.
func loadImage(s *Server, in map[string]any) ([]any, *Failure) {
	name, _ := in["image"].(string)
	k, p := loadImageFile(name)
	s.mu.Lock()
	data, ok := s.inputFileLocked(k)
	s.mu.Unlock()
	if !ok {
		return nil, &Failure{ExceptionType: "FileNotFoundError",
			ExceptionMessage: "[Errno 2] No such file or directory: " + pyRepr(p),
			Traceback:        loadImageTraceback(missingFrames...)}
	}
	frames, alpha, f := decodeImage(data, p)
	if f != nil {
		return nil, f
	}
	b := frames[0].Bounds()
	img := &imgVal{w: b.Dx(), h: b.Dy(), batch: len(frames), channels: 3}
	mask := &imgVal{w: 64, h: 64, batch: len(frames), channels: 1}
	for _, fr := range frames {
		rgb, m := splitAlpha(fr)
		img.pix = append(img.pix, rgb)
		if alpha {
			mask.pix = append(mask.pix, m)
		}
	}
	if alpha {
		mask.w, mask.h = b.Dx(), b.Dy()
	}
	return []any{img, mask}, nil
}

// decodeImage decodes a PNG, JPEG or GIF into NRGBA frames of one size and
// reports whether they have an alpha channel. p names the file in errors.
func decodeImage(data []byte, p string) (frames []*image.NRGBA, alpha bool, f *Failure) {
	var (
		m    image.Image
		g    *gif.GIF
		err  error
		cerr error
	)
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		if _, cerr = png.DecodeConfig(bytes.NewReader(data)); cerr == nil {
			m, err = png.Decode(bytes.NewReader(data))
		}
	case bytes.HasPrefix(data, []byte("\xff\xd8\xff")):
		if _, cerr = jpeg.DecodeConfig(bytes.NewReader(data)); cerr == nil {
			m, err = jpeg.Decode(bytes.NewReader(data))
		}
	case bytes.HasPrefix(data, []byte("GIF87a")) || bytes.HasPrefix(data, []byte("GIF89a")):
		if _, cerr = gif.DecodeConfig(bytes.NewReader(data)); cerr == nil {
			g, err = gif.DecodeAll(bytes.NewReader(data))
		}
	default:
		cerr = errors.New("unknown format")
	}
	if cerr != nil {
		// Image.open could not read a header it knows.
		return nil, false, &Failure{ExceptionType: "PIL.UnidentifiedImageError",
			ExceptionMessage: "cannot identify image file " + pyRepr(p),
			Traceback:        loadImageTraceback(openFrames...)}
	}
	if err != nil {
		// The header was fine; the pixel data was not (Pillow reads it
		// lazily, in convert).
		msg := "broken data stream when reading image file"
		if errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "not enough pixel data") {
			msg = "image file is truncated"
		}
		return nil, false, &Failure{ExceptionType: "OSError", ExceptionMessage: msg,
			Traceback: loadImageTraceback(convertFrames...)}
	}
	if g != nil {
		return gifFrames(g), gifHasAlpha(g), nil
	}
	return []*image.NRGBA{toNRGBA(m)}, hasAlpha(m), nil
}

// hasAlpha reports whether Pillow would give m an alpha band (RGBA, LA, or
// a palette with transparency).
func hasAlpha(m image.Image) bool {
	switch t := m.(type) {
	case *image.NRGBA, *image.NRGBA64:
		return true
	case *image.Paletted:
		return paletteHasAlpha(t.Palette)
	}
	return false
}

func paletteHasAlpha(p color.Palette) bool {
	for _, c := range p {
		if _, _, _, a := c.RGBA(); a != 0xFFFF {
			return true
		}
	}
	return false
}

func gifHasAlpha(g *gif.GIF) bool {
	for _, fr := range g.Image {
		if paletteHasAlpha(fr.Palette) {
			return true
		}
	}
	return false
}

// gifFrames composites the frames of an animated GIF onto its canvas, as a
// browser shows them (Pillow's ImageSequence does the same).
func gifFrames(g *gif.GIF) []*image.NRGBA {
	w, h := g.Config.Width, g.Config.Height
	if w == 0 || h == 0 {
		b := g.Image[0].Bounds()
		w, h = b.Max.X, b.Max.Y
	}
	canvas := image.NewNRGBA(image.Rect(0, 0, w, h))
	var out []*image.NRGBA
	for i, fr := range g.Image {
		var saved *image.NRGBA
		disposal := byte(0)
		if i < len(g.Disposal) {
			disposal = g.Disposal[i]
		}
		if disposal == gif.DisposalPrevious {
			saved = cloneNRGBA(canvas)
		}
		draw.Draw(canvas, fr.Bounds(), fr, fr.Bounds().Min, draw.Over)
		out = append(out, cloneNRGBA(canvas))
		switch disposal {
		case gif.DisposalBackground:
			draw.Draw(canvas, fr.Bounds(), image.Transparent, image.Point{}, draw.Src)
		case gif.DisposalPrevious:
			canvas = saved
		}
	}
	return out
}

func cloneNRGBA(m *image.NRGBA) *image.NRGBA {
	c := *m
	c.Pix = bytes.Clone(m.Pix)
	return &c
}

// toNRGBA converts m to non-premultiplied RGBA at origin (0, 0), keeping
// the stored colour of translucent pixels as Pillow's convert("RGB") does.
func toNRGBA(m image.Image) *image.NRGBA {
	b := m.Bounds()
	out := image.NewNRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	switch t := m.(type) {
	case *image.NRGBA:
		for y := 0; y < b.Dy(); y++ {
			copy(out.Pix[y*out.Stride:][:4*b.Dx()], t.Pix[t.PixOffset(b.Min.X, b.Min.Y+y):])
		}
	case *image.Paletted:
		pal := make([]color.NRGBA, len(t.Palette))
		for i, c := range t.Palette {
			pal[i] = color.NRGBAModel.Convert(c).(color.NRGBA)
		}
		for y := 0; y < b.Dy(); y++ {
			for x := 0; x < b.Dx(); x++ {
				if i := int(t.ColorIndexAt(b.Min.X+x, b.Min.Y+y)); i < len(pal) {
					out.SetNRGBA(x, y, pal[i])
				}
			}
		}
	case *image.RGBA, *image.YCbCr, *image.Gray, *image.CMYK:
		// Opaque in practice (PNG truecolour and grey, JPEG): draw's fast
		// paths convert exactly.
		draw.Draw(out, out.Rect, m, b.Min, draw.Src)
	default:
		for y := 0; y < b.Dy(); y++ {
			for x := 0; x < b.Dx(); x++ {
				out.SetNRGBA(x, y, color.NRGBAModel.Convert(m.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA))
			}
		}
	}
	return out
}

// splitAlpha returns the RGB of m (alpha dropped, as convert("RGB")) and
// its mask 1 - alpha as grey pixels.
func splitAlpha(m *image.NRGBA) (rgb, mask *image.RGBA) {
	rgb = image.NewRGBA(m.Rect)
	mask = image.NewRGBA(m.Rect)
	for i := 0; i < len(m.Pix); i += 4 {
		copy(rgb.Pix[i:i+3], m.Pix[i:i+3])
		rgb.Pix[i+3] = 255
		g := 255 - m.Pix[i+3]
		mask.Pix[i], mask.Pix[i+1], mask.Pix[i+2], mask.Pix[i+3] = g, g, g, 255
	}
	return rgb, mask
}

// The traceback frames of LoadImage's failures (ComfyUI 0.3.64, Pillow 11).
var (
	openFrames = []string{
		"  File \"<comfyui>/nodes.py\", line 1668, in load_image\n    img = node_helpers.pillow(Image.open, image_path)\n          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
		"  File \"<comfyui>/node_helpers.py\", line 21, in pillow\n    x = fn(arg)\n        ^^^^^^^\n",
		"  File \"<venv>/site-packages/PIL/Image.py\", line 3580, in open\n    raise UnidentifiedImageError(msg)\n",
	}
	missingFrames = []string{
		openFrames[0], openFrames[1],
		"  File \"<venv>/site-packages/PIL/Image.py\", line 3513, in open\n    fp = builtins.open(filename, \"rb\")\n         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
	}
	convertFrames = []string{
		"  File \"<comfyui>/nodes.py\", line 1683, in load_image\n    image = i.convert(\"RGB\")\n            ^^^^^^^^^^^^^^^^\n",
		"  File \"<venv>/site-packages/PIL/Image.py\", line 984, in convert\n    self.load()\n",
		"  File \"<venv>/site-packages/PIL/ImageFile.py\", line 391, in load\n    raise _get_oserror(err_code, encoder=False)\n",
	}
)

// loadImageTraceback is the executor's frames followed by the node's.
func loadImageTraceback(node ...string) []string {
	return append(append([]string(nil), executorFrames...), node...)
}
