package comfytest

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/draw"
	"image/jpeg"
	"image/png"
	"sync"
)

// imgVal stands in for an IMAGE or MASK tensor. Generated images (EmptyImage,
// a sampler's output) do no image math: they carry their shape and a colour
// per batch item, so saved files are real PNGs of the requested size that
// cost microseconds to build. Images read by LoadImage carry their pixels.
// A value is shared between nodes and the cache: never modify one, copy it.
type imgVal struct {
	w, h, batch int
	color       uint32        // 0xRRGGBB of every item, unless colors or pix says otherwise
	colors      []uint32      // per item colours (a sampler's output), may be shorter than batch
	pix         []*image.RGBA // per item pixels (LoadImage), each w x h and opaque
	channels    int           // 3 for RGB images, 1 for masks, 4 with alpha
}

// String is format_value's rendering of a tensor: a MASK has no channel
// dimension.
func (v *imgVal) String() string {
	if v.channels == 1 {
		return fmt.Sprintf("tensor(shape=[%d, %d, %d])", v.batch, v.h, v.w)
	}
	return fmt.Sprintf("tensor(shape=[%d, %d, %d, %d])", v.batch, v.h, v.w, v.channels)
}

// colorAt is the colour of batch item i of a generated image.
func (v *imgVal) colorAt(i int) uint32 {
	if i < len(v.colors) {
		return v.colors[i]
	}
	return v.color
}

// maxSaved bounds the files one save node writes for a batch.
const maxSaved = 64

// saved is the number of files a save node writes for v.
func (v *imgVal) saved() int { return min(max(v.batch, 1), maxSaved) }

// mapPix returns a copy of v whose pixel items are f of v's, or v's copy
// unchanged when it carries no pixels.
func (v *imgVal) mapPix(f func(*image.RGBA) *image.RGBA) *imgVal {
	out := *v
	if v.pix != nil {
		out.pix = make([]*image.RGBA, len(v.pix))
		for i, p := range v.pix {
			out.pix[i] = f(p)
		}
		if len(out.pix) > 0 {
			b := out.pix[0].Bounds()
			out.w, out.h = b.Dx(), b.Dy()
		}
	}
	return &out
}

// invertPix is ImageInvert on pixels: 1 - x per channel.
func invertPix(p *image.RGBA) *image.RGBA {
	q := image.NewRGBA(p.Rect)
	for i := 0; i < len(p.Pix); i += 4 {
		q.Pix[i], q.Pix[i+1], q.Pix[i+2], q.Pix[i+3] = 255-p.Pix[i], 255-p.Pix[i+1], 255-p.Pix[i+2], 255
	}
	return q
}

// scalePix resizes p to w x h by nearest neighbour (every upscale_method
// the fake accepts is done this way).
func scalePix(p *image.RGBA, w, h int) *image.RGBA {
	b := p.Bounds()
	q := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		sy := b.Min.Y + y*b.Dy()/h
		for x := 0; x < w; x++ {
			sx := b.Min.X + x*b.Dx()/w
			si := p.PixOffset(sx, sy)
			copy(q.Pix[q.PixOffset(x, y):][:4], p.Pix[si:si+4])
		}
	}
	return q
}

// channelPix is ImageToMask on pixels: channel c (0 red, 1 green, 2 blue)
// as a grey image, the way masks are stored.
func channelPix(c int) func(*image.RGBA) *image.RGBA {
	return func(p *image.RGBA) *image.RGBA {
		q := image.NewRGBA(p.Rect)
		for i := 0; i < len(p.Pix); i += 4 {
			g := p.Pix[i+c]
			q.Pix[i], q.Pix[i+1], q.Pix[i+2], q.Pix[i+3] = g, g, g, 255
		}
		return q
	}
}

// encodeItem is the PNG a save node writes for batch item i of v.
func (s *Server) encodeItem(v *imgVal, i int) []byte {
	if i < len(v.pix) {
		var b bytes.Buffer
		_ = pngEncoder.Encode(&b, v.pix[i])
		return b.Bytes()
	}
	return s.imgs.solidPNG(max(v.w, 1), max(v.h, 1), v.colorAt(i))
}

// SolidPNG returns an 8-bit RGB PNG of width x height pixels all of colour
// rgb (0xRRGGBB), as the fake's SaveImage writes them: a real image to
// upload for LoadImage, which decodes what it reads. Sides below 1 count
// as 1.
func SolidPNG(width, height int, rgb uint32) []byte {
	return newImageCache().solidPNG(max(width, 1), max(height, 1), rgb&0xFFFFFF)
}

// pngEncoder reuses the (large) zlib state between encodes.
var pngEncoder = &png.Encoder{BufferPool: &pngPool{}}

type pngPool struct{ p sync.Pool }

func (p *pngPool) Get() *png.EncoderBuffer {
	b, _ := p.p.Get().(*png.EncoderBuffer)
	return b
}

func (p *pngPool) Put(b *png.EncoderBuffer) { p.p.Put(b) }

// imageCache holds what makes generated images cheap: per image width, the
// deflate segments solidPNG repeats, and the encoded sampler previews. It
// is owned by one Server and bounded.
type imageCache struct {
	mu       sync.Mutex
	widths   map[int]*rowSegs
	previews map[previewKey][]byte
}

// rowSegs are raw deflate segments for one image width w, each ending in a
// sync flush so that they can follow each other in one stream (a segment
// never refers back before its own start).
type rowSegs struct {
	head []byte         // the 3w-3 zero bytes that end the first row
	rows []byte         // k rows of [2 (Up filter), 3w zero bytes]; nil until an image has k rows
	k    int            // rows in rows
	rest map[int][]byte // n < k such rows, by n
}

type previewKey struct {
	w, h  int
	color uint32
}

const maxCached = 256

func newImageCache() *imageCache {
	return &imageCache{widths: map[int]*rowSegs{}, previews: map[previewKey][]byte{}}
}

// deflateSeg compresses n bytes, each row of rowLen bytes starting with
// first and zero otherwise, into a sync-flushed raw deflate segment.
func deflateSeg(n, rowLen int, first byte) []byte {
	raw := make([]byte, n)
	if first != 0 {
		for i := 0; i < n; i += rowLen {
			raw[i] = first
		}
	}
	var b bytes.Buffer
	fw, _ := flateWriters.Get().(*flate.Writer)
	if fw == nil {
		fw, _ = flate.NewWriter(&b, flate.BestSpeed)
	} else {
		fw.Reset(&b)
	}
	_, _ = fw.Write(raw)
	_ = fw.Flush()
	flateWriters.Put(fw)
	return b.Bytes()
}

// flateWriters reuses deflateSeg's writers: each holds about a megabyte of
// tables, and every Server's first image of a width needs two.
var flateWriters sync.Pool

// segs returns the segments for width w and the one for n remaining rows.
func (c *imageCache) segs(w, n int) (*rowSegs, []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rs := c.widths[w]
	if rs == nil {
		if len(c.widths) >= maxCached {
			clear(c.widths)
		}
		rowLen := 3*w + 1
		k := max(1, (256<<10)/rowLen)
		rs = &rowSegs{head: deflateSeg(3*w-3, rowLen, 0), k: k, rest: map[int][]byte{}}
		c.widths[w] = rs
	}
	if n >= rs.k && rs.rows == nil { // only images of k rows or more repeat it
		rs.rows = deflateSeg(rs.k*(3*w+1), 3*w+1, 2)
	}
	n %= rs.k
	rest, ok := rs.rest[n]
	if !ok && n > 0 {
		rest = deflateSeg(n*(3*w+1), 3*w+1, 2)
		rs.rest[n] = rest
	}
	return rs, rest
}

// solidPNG builds an 8-bit RGB PNG of w x h pixels of colour col (the
// format ComfyUI's SaveImage writes) without compressing its pixels: the
// first row uses PNG's Sub filter ([1, r, g, b, 0...]) and the others the
// Up filter ([2, 0...]), so the image data is the colour plus rows that
// only depend on the width, whose compressed form is cached and repeated.
func (c *imageCache) solidPNG(w, h int, col uint32) []byte {
	rs, rest := c.segs(w, h-1)
	reps := (h - 1) / rs.k
	r, g, bl := byte(col>>16), byte(col>>8), byte(col)

	idat := make([]byte, 0, 2+9+len(rs.head)+reps*len(rs.rows)+len(rest)+5+4)
	idat = append(idat, 0x78, 0x01)                          // zlib header: deflate, 32K window
	idat = append(idat, 0x00, 4, 0, 0xfb, 0xff, 1, r, g, bl) // stored block: Sub filter + the colour
	idat = append(idat, rs.head...)
	for range reps {
		idat = append(idat, rs.rows...)
	}
	idat = append(idat, rest...)
	idat = append(idat, 0x01, 0, 0, 0xff, 0xff) // final empty stored block

	// Adler-32 of the filtered rows: a zero byte leaves a alone and adds a
	// to b, so a run of n zeros adds n*a.
	const mod = 65521
	a, b := uint64(1), uint64(0)
	for _, x := range []byte{1, r, g, bl} {
		a = (a + uint64(x)) % mod
		b = (b + a) % mod
	}
	b = (b + uint64(3*w-3)*a) % mod
	for range h - 1 {
		a = (a + 2) % mod
		b = (b + a + uint64(3*w)*a) % mod
	}
	idat = binary.BigEndian.AppendUint32(idat, uint32(b<<16|a))

	out := make([]byte, 0, 8+25+12+len(idat)+12)
	out = append(out, "\x89PNG\r\n\x1a\n"...)
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2 // 8 bits per sample, truecolour
	out = appendChunk(out, "IHDR", ihdr[:])
	out = appendChunk(out, "IDAT", idat)
	return appendChunk(out, "IEND", nil)
}

func appendChunk(out []byte, typ string, data []byte) []byte {
	out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
	start := len(out)
	out = append(out, typ...)
	out = append(out, data...)
	return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(out[start:]))
}

// maxPreviewSide is the real server's default --preview-size.
const maxPreviewSide = 512

// previewJPEG is a sampler's preview of a latent of w x h pixels in colour
// col: a JPEG of the latent's size (w/8 x h/8, as the latent2rgb previewer
// makes it), sides capped at 512 px.
func (c *imageCache) previewJPEG(w, h int, col uint32) []byte {
	pw, ph := max(w/8, 1), max(h/8, 1)
	if m := max(pw, ph); m > maxPreviewSide {
		pw, ph = max(pw*maxPreviewSide/m, 1), max(ph*maxPreviewSide/m, 1)
	}
	k := previewKey{pw, ph, col}
	c.mu.Lock()
	data, ok := c.previews[k]
	c.mu.Unlock()
	if ok {
		return data
	}
	img := image.NewRGBA(image.Rect(0, 0, pw, ph))
	draw.Draw(img, img.Rect, image.NewUniform(color.RGBA{R: uint8(col >> 16), G: uint8(col >> 8), B: uint8(col), A: 255}), image.Point{}, draw.Src)
	var b bytes.Buffer
	_ = jpeg.Encode(&b, img, &jpeg.Options{Quality: 95})
	data = b.Bytes()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.previews) >= maxCached {
		clear(c.previews)
	}
	c.previews[k] = data
	return data
}
