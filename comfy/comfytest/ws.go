package comfytest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"
	"github.com/google/uuid"
)

type frame struct {
	binary bool
	data   []byte
	buf    *[]byte // data's pooled buffer, returned once data is written (see getBuf); nil when data is its own
}

// release returns the frame's pooled buffer, if any: its bytes were
// written, or never will be.
func (f frame) release() {
	if f.buf != nil {
		putBuf(f.buf)
	}
}

// wsConn is one accepted WebSocket. Frames are queued (unbounded, so the
// executor never blocks on a slow client) and written by one goroutine.
type wsConn struct {
	s   *Server
	c   *websocket.Conn
	sid string

	mu          sync.Mutex
	q           []frame // q[head:] waits to be written
	head        int
	closed      bool
	dropLeft    int
	deafLeft    int
	deaf        bool
	previewMeta bool
	signal      chan struct{}
	done        chan struct{}
}

func (c *wsConn) enqueue(f frame) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if c.head > 0 && (c.head == len(c.q) || c.head >= cap(c.q)/2) {
		// Reuse the front, written already, rather than grow: as q[1:],
		// the queue left its array behind at every append past its end.
		n := copy(c.q, c.q[c.head:])
		clear(c.q[n:])
		c.q, c.head = c.q[:n], 0
	}
	c.q = append(c.q, f)
	c.mu.Unlock()
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

func (c *wsConn) setDrop(k int) {
	c.mu.Lock()
	c.dropLeft = k
	c.mu.Unlock()
}

func (c *wsConn) setDeaf(k int) {
	c.mu.Lock()
	c.deafLeft = k
	if k == 0 {
		c.deaf = false
	}
	c.mu.Unlock()
}

func (c *wsConn) wantsPreviewMeta() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.previewMeta
}

// popLocked takes the next frame to write; ok is false when there is
// none, or the connection closed. c.mu is held.
func (c *wsConn) popLocked() (f frame, ok bool) {
	if c.head == len(c.q) || c.closed {
		return frame{}, false
	}
	f = c.q[c.head]
	c.q[c.head] = frame{}
	c.head++
	return f, true
}

// writer sends queued frames until the connection ends.
func (c *wsConn) writer() {
	// A write ends when the connection closes (Close, dropSockets and
	// handleWS close it), not with a context: one that is never done
	// spares coder/websocket a context.AfterFunc per frame.
	ctx := context.WithoutCancel(c.s.ctx)
	for {
		select {
		case <-c.signal:
		case <-c.done:
			return
		}
		for {
			c.mu.Lock()
			f, ok := c.popLocked()
			if !ok {
				c.mu.Unlock()
				break
			}
			if c.deaf {
				c.mu.Unlock()
				f.release()
				continue
			}
			c.mu.Unlock()
			typ := websocket.MessageText
			if f.binary {
				typ = websocket.MessageBinary
			}
			err := c.c.Write(ctx, typ, f.data) // which keeps nothing of f.data once it returned
			f.release()
			if err != nil {
				c.c.CloseNow()
				return
			}
			c.mu.Lock()
			drop := false
			if c.dropLeft > 0 {
				c.dropLeft--
				drop = c.dropLeft == 0
			}
			if c.deafLeft > 0 {
				c.deafLeft--
				if c.deafLeft == 0 {
					c.deaf = true
				}
			}
			c.mu.Unlock()
			if drop {
				c.c.CloseNow()
				return
			}
		}
	}
}

func (s *Server) connList() []*wsConn {
	out := make([]*wsConn, 0, len(s.allConns))
	for c := range s.allConns {
		out = append(out, c)
	}
	return out
}

// dropSockets closes the given connections (all when nil) abruptly.
func (s *Server) dropSockets(conns []*wsConn) {
	if conns == nil {
		s.mu.Lock()
		conns = s.connList()
		s.mu.Unlock()
	}
	for _, c := range conns {
		c.c.CloseNow()
	}
}

func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	sid := r.URL.Query().Get("clientId")
	if sid == "" {
		sid = strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	wc, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.Debug("comfytest: websocket accept failed", "error", err)
		return
	}
	wc.SetReadLimit(1 << 20)
	c := &wsConn{s: s, c: wc, sid: sid, signal: make(chan struct{}, 1), done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		wc.CloseNow()
		return
	}
	s.clientIDs = append(s.clientIDs, sid)
	s.sockets[sid] = c
	s.allConns[c] = struct{}{}
	c.dropLeft, c.deafLeft = s.dropAfter, s.deafAfter
	c.enqueue(frame{data: pyJSON(omap{{"type", "status"}, {"data", omap{{"status", s.statusLocked()}, {"sid", sid}}}})})
	if t := s.running; t != nil && t.hasClient && (t.clientID == sid || s.cloud != nil) && s.lastNode != "" {
		c.enqueue(frame{data: pyJSON(omap{{"type", "executing"}, {"data", omap{{"node", s.lastNode}}}})})
	}
	s.mu.Unlock()
	s.log.Debug("comfytest: websocket connected", "client_id", sid)

	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		c.writer()
	}()

	first := true
	for {
		typ, data, err := wc.Read(s.ctx)
		if err != nil {
			break
		}
		if typ != websocket.MessageText {
			continue
		}
		if first {
			first = false
			var msg struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			}
			if json.Unmarshal(data, &msg) == nil && msg.Type == "feature_flags" && !s.opts.Dialect.NoFeatures {
				c.mu.Lock()
				c.previewMeta = msg.Data["supports_preview_metadata"] == true
				c.mu.Unlock()
				c.enqueue(frame{data: pyJSON(omap{{"type", "feature_flags"}, {"data", serverFeatures()}})})
			}
		}
	}
	// As the real server's finally block: the mapping for this sid is
	// removed even when a newer socket with the same clientId replaced it.
	s.mu.Lock()
	delete(s.sockets, sid)
	delete(s.allConns, c)
	s.mu.Unlock()
	c.mu.Lock()
	c.closed = true
	c.q, c.head = nil, 0
	c.mu.Unlock()
	close(c.done)
	wwg.Wait()
	wc.CloseNow()
	s.log.Debug("comfytest: websocket closed", "client_id", sid)
}

func serverFeatures() omap {
	return omap{{"supports_preview_metadata", true}, {"max_upload_size", 104857600}}
}

// statusLocked is the status payload; s.mu is held.
func (s *Server) statusLocked() omap {
	n := len(s.queue)
	if s.running != nil {
		n++
	}
	return omap{{"exec_info", omap{{"queue_remaining", n}}}}
}

func (s *Server) broadcastStatusLocked() {
	s.sendLocked("", false, "status", omap{{"status", s.statusLocked()}})
}

// sendLocked routes a JSON message: to the client when has is true (dropped
// if it is not connected), otherwise to every registered socket. The
// cloud dialect ignores client ids: every socket gets every message.
func (s *Server) sendLocked(client string, has bool, typ string, data omap) {
	s.sendFrameLocked(client, has, func(b []byte) []byte { return appendPyMessage(b, typ, data) })
}

// sendFrameLocked routes a JSON message as sendLocked does, the frame
// appended by encode: into a pooled buffer, which the socket's writer
// returns once it wrote it; a frame for several sockets is copied once
// for them all.
func (s *Server) sendFrameLocked(client string, has bool, encode func(b []byte) []byte) {
	var one *wsConn
	n := 0
	switch {
	case s.cloud != nil:
		n = len(s.allConns)
		for c := range s.allConns {
			one = c
		}
	case has:
		if one = s.sockets[client]; one != nil {
			n = 1
		}
	default:
		n = len(s.sockets)
		for _, c := range s.sockets {
			one = c
		}
	}
	if n == 0 {
		return
	}
	buf := getBuf()
	*buf = encode(*buf)
	if n == 1 {
		one.enqueue(frame{data: *buf, buf: buf})
		return
	}
	b := bytes.Clone(*buf)
	putBuf(buf)
	if s.cloud != nil {
		for c := range s.allConns {
			c.enqueue(frame{data: b})
		}
		return
	}
	for _, c := range s.sockets {
		c.enqueue(frame{data: b})
	}
}

// appendPyMessage appends the frame of a message, as pyJSON encodes
// omap{{"type", typ}, {"data", data}}.
func appendPyMessage(b []byte, typ string, data omap) []byte {
	start := len(b)
	b = append(b, `{"type": `...)
	b = appendPyString(b, typ)
	b = append(b, `, "data": `...)
	b, err := appendPyObject(b, data)
	if err != nil {
		return appendEncodeError(b[:start], err) // as pyJSON answers

	}
	return append(b, '}')
}

// sendPreviewLocked sends one preview frame, type 4 to a targeted socket that
// negotiated supports_preview_metadata, else type 1. metaFirst reports
// whether a type-4 frame was sent (it precedes the progress message).
func (s *Server) previewTargets(client string, has bool) []*wsConn {
	if s.cloud != nil {
		return s.connList()
	}
	if has {
		if c := s.sockets[client]; c != nil {
			return []*wsConn{c}
		}
		return nil
	}
	out := make([]*wsConn, 0, len(s.sockets))
	for _, c := range s.sockets {
		out = append(out, c)
	}
	return out
}

func preview1(img []byte) []byte {
	b := make([]byte, 8, 8+len(img))
	binary.BigEndian.PutUint32(b[0:], 1)
	binary.BigEndian.PutUint32(b[4:], 1) // JPEG
	return append(b, img...)
}

func preview4(meta omap, img []byte) []byte {
	m := pyJSON(meta)
	b := make([]byte, 8, 8+len(m)+len(img))
	binary.BigEndian.PutUint32(b[0:], 4)
	binary.BigEndian.PutUint32(b[4:], uint32(len(m)))
	b = append(b, m...)
	return append(b, img...)
}

func textFrame(nodeID, text string) []byte {
	b := make([]byte, 8, 8+len(nodeID)+len(text))
	binary.BigEndian.PutUint32(b[0:], 3)
	binary.BigEndian.PutUint32(b[4:], uint32(len(nodeID)))
	b = append(b, nodeID...)
	return append(b, text...)
}
