package comfytest

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// A recorded request gives back its header as it came: every key, every
// value in order, empty values too.
func TestRecordedRequestHeader(t *testing.T) {
	r := httptest.NewRequest("POST", "/prompt?x=1", nil)
	r.Header = http.Header{
		"Authorization": {"Bearer t"},
		"X-Multi":       {"a", "", "c"},
		"Empty":         {""},
	}
	got := recordRequest(r).request()
	want := Request{Method: "POST", Path: "/prompt", RawQuery: "x=1", Header: r.Header}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("recorded %+v, want %+v", got, want)
	}
}

// With MaxRecords, Requests and Prompts keep the newest records only,
// however many the server saw, and a prompt's record still gets its end.
func TestMaxRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInMemoryServer(&Options{MaxRecords: 3})
		defer s.Close()
		c := s.Client()
		wf := `{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "t"}}}}`
		for i := range 10 {
			resp, err := c.Post(s.URL+"/prompt", "application/json", strings.NewReader(wf))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("prompt %d: %s", i, resp.Status)
			}
		}
		synctest.Wait() // every prompt ran
		if n := len(s.Requests()); n != 3 {
			t.Errorf("Requests kept %d, want 3", n)
		}
		ps := s.Prompts()
		if len(ps) != 3 {
			t.Fatalf("Prompts kept %d, want 3", len(ps))
		}
		for _, p := range ps {
			if p.Status != 200 || p.Ended.IsZero() {
				t.Errorf("a kept prompt: status %d, ended %v", p.Status, p.Ended)
			}
		}
		s.mu.Lock()
		held := len(s.prompts) + len(s.requests)
		s.mu.Unlock()
		if held >= 4*3 {
			t.Errorf("the server holds %d records, want fewer than twice MaxRecords of each", held)
		}
	})
}

// TestWSQueueOrder: frames leave a socket's queue in the order they
// entered it, whether the writer keeps up or lags, and the queue reuses
// its array instead of growing while the writer is not far behind.
func TestWSQueueOrder(t *testing.T) {
	t.Parallel()
	c := &wsConn{signal: make(chan struct{}, 1)}
	next, want := 0, 0
	push := func(n int) {
		for range n {
			c.enqueue(frame{data: []byte(strconv.Itoa(next))})
			next++
		}
	}
	pop := func(n int) {
		t.Helper()
		for range n {
			c.mu.Lock()
			f, ok := c.popLocked()
			c.mu.Unlock()
			require.True(t, ok)
			require.Equal(t, strconv.Itoa(want), string(f.data))
			want++
		}
	}
	for range 100 { // the writer keeps up
		push(3)
		pop(3)
	}
	for range 100 { // the writer lags: two behind, then five, ...
		push(5)
		pop(3)
	}
	require.LessOrEqual(t, cap(c.q), 2*(len(c.q)-c.head), "an array for the frames waiting, not for all of them")
	pop(next - want)
	c.mu.Lock()
	_, ok := c.popLocked()
	c.mu.Unlock()
	require.False(t, ok)
}
