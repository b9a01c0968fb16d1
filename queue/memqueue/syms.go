package memqueue

// symtab interns the small strings that repeat across records (workflow
// hashes and keys, backend names, tags, needs, metadata keys, error
// classes and node types), as a database would keep them in a lookup
// table: a record stores a symbol's number (a one- or two-byte varint)
// instead of the string. Symbols are reference-counted by the records that
// hold them and freed (their numbers reused) when the last one goes.
// Symbol 0 is the empty string and is not counted.
type symtab struct {
	ids  map[string]uint32
	strs []string
	refs []uint32
	free []uint32
	// recent holds the symbols interned last, tried before the map: a
	// batch of jobs repeats the same workflow hash and key (a string
	// comparison, often of the same pointer, costs less than hashing).
	recent [2]uint32
	next   int
}

func newSymtab() symtab {
	return symtab{ids: map[string]uint32{}, strs: []string{""}, refs: []uint32{0}}
}

// intern returns s's symbol, adding it (with no reference) if it is new.
// The caller must retain it before the next release of any symbol.
func (t *symtab) intern(s string) uint32 {
	if s == "" {
		return 0
	}
	for _, id := range t.recent {
		if id != 0 && t.strs[id] == s {
			return id
		}
	}
	if id, ok := t.ids[s]; ok {
		t.remember(id)
		return id
	}
	var id uint32
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
		t.strs[id], t.refs[id] = s, 0
	} else {
		id = uint32(len(t.strs))
		t.strs = append(t.strs, s)
		t.refs = append(t.refs, 0)
	}
	t.ids[s] = id
	t.remember(id)
	return id
}

func (t *symtab) remember(id uint32) {
	t.recent[t.next] = id
	t.next = (t.next + 1) % len(t.recent)
}

// lookup returns s's symbol without adding it; ok is false when no record
// holds s.
func (t *symtab) lookup(s string) (uint32, bool) {
	if s == "" {
		return 0, true
	}
	id, ok := t.ids[s]
	return id, ok
}

func (t *symtab) str(id uint32) string { return t.strs[id] }

func (t *symtab) retain(id uint32) {
	if id != 0 {
		t.refs[id]++
	}
}

func (t *symtab) release(id uint32) {
	if id == 0 {
		return
	}
	if t.refs[id]--; t.refs[id] == 0 {
		delete(t.ids, t.strs[id])
		t.strs[id] = ""
		t.free = append(t.free, id)
		for i, r := range t.recent {
			if r == id {
				t.recent[i] = 0
			}
		}
	}
}
