package hash

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

func addSeeds(f *testing.F) {
	for _, w := range []string{
		emptyImageWorkflow,
		sd15Workflow,
		string(genWorkflow(10)),
		`{"1":{"class_type":"EmptyImage","inputs":{}}}`,
		`{"1":{"class_type":"ImageInvert","inputs":{"image":["1",0]}}}`,
		`{"1":{"class_type":"PreviewImage","inputs":{"images":[3,0]}}}`,
		`{"1":{"class_type":"X","inputs":{"a":{"__value__":[1,2.5e3,"s"]},"b":null,"c":true,"seed":18446744073709551615}}}`,
		`{"1":{"class_type":"EmptyImage","inputs":{}},"2":{"class_type":"PreviewImage","inputs":{"images":["1",0.0]}}}`,
		`{"12:5":{"class_type":"EmptyImage","inputs":{}},"12:5:7":{"class_type":"PreviewImage","inputs":{"images":["12:5",0]}}}`,
		`{"1":{"class_type":"E\u00e9","inputs":{"t":"\ud83d\ude00 \n"}},"2":{"class_type":"X","inputs":{"x":["1",-1]}}}`,
		`{"1":{"class_type":"X","inputs":{"x":["2",0]}}}`,
		`{}`, `[]`, `null`, `{"1":{}} x`, ``,
	} {
		f.Add([]byte(w))
	}
}

// FuzzExact checks that Exact never panics, and that when it succeeds the
// hash survives a decode/re-encode round trip (exact numbers) and
// re-indentation.
func FuzzExact(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Exact(data)
		if err != nil {
			if s != (Sum{}) {
				t.Fatalf("non-zero sum with error %v", err)
			}
			return
		}
		m, err := decodeWorkflow(data)
		if err != nil {
			t.Fatalf("Exact accepted input the decoder rejects: %v", err)
		}
		re, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if s2, err := Exact(re); err != nil || s2 != s {
			t.Fatalf("re-encoded hash differs: %v, %v\noriginal: %q\nre-encoded: %q", s2, err, data, re)
		}
		var ind bytes.Buffer
		if err := json.Indent(&ind, data, "", "\t"); err != nil {
			t.Fatal(err)
		}
		if s3, err := Exact(ind.Bytes()); err != nil || s3 != s {
			t.Fatalf("indented hash differs: %v, %v", s3, err)
		}
	})
}

// FuzzStructure checks that Structure never panics, that Exact accepts
// whatever Structure accepts, and that when it succeeds renaming the node
// ids (links rewritten) keeps the hash.
func FuzzStructure(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Structure(data)
		if err != nil {
			if s != (Sum{}) {
				t.Fatalf("non-zero sum with error %v", err)
			}
			return
		}
		if _, err := Exact(data); err != nil {
			t.Fatalf("Exact rejects a workflow Structure accepts: %v", err)
		}
		m, err := decodeWorkflow(data)
		if err != nil {
			t.Fatal(err)
		}
		// A permutation of the existing ids: each id takes the next one
		// in sorted order.
		ids := make([]string, 0, len(m))
		for id := range m {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		next := make(map[string]string, len(ids))
		for i, id := range ids {
			next[id] = ids[(i+1)%len(ids)]
		}
		for _, rename := range []func(string) string{
			func(id string) string { return next[id] },
			func(id string) string { return "x" + id },
		} {
			re, err := renumber(data, rename)
			if err != nil {
				t.Fatal(err)
			}
			if s2, err := Structure(re); err != nil || s2 != s {
				t.Fatalf("renumbered hash differs: %v, %v\noriginal: %q\nrenumbered: %q", s2, err, data, re)
			}
		}
	})
}
