package comfytest

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
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
