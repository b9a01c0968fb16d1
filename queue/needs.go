package queue

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
)

const (
	valueNeedPrefix = "value:"
	listCapPrefix   = "list:"
)

// ValueNeed returns the value need "value:<key>=<value>" (see
// [Capabilities]). key must be non-empty and must not contain '='; value
// may be anything.
func ValueNeed(key, value string) string {
	return valueNeedPrefix + key + "=" + value
}

// ListCapability returns "list:<key>", the capability item that says the
// lessee restricts key to the values it holds as value needs ([ValueNeed])
// in the same set.
func ListCapability(key string) string { return listCapPrefix + key }

// SplitValueNeed returns the key and value of a value need, and false for
// any other need.
func SplitValueNeed(need string) (key, value string, ok bool) {
	rest, ok := strings.CutPrefix(need, valueNeedPrefix)
	if !ok {
		return "", "", false
	}
	key, value, ok = strings.Cut(rest, "=")
	if !ok || key == "" {
		return "", "", false
	}
	return key, value, true
}

// Capabilities is a lessee's capability set for the Needs filter: a set of
// strings with a content digest. Build one with [NewCapabilities] each time
// the lessee's capabilities change and pass the same value to every Lease:
// drivers may cache decisions by [Capabilities.Digest].
//
// A nil *Capabilities stands for a lessee that does not filter by
// capabilities: it meets every need. A Capabilities is immutable and safe
// for concurrent use.
type Capabilities struct {
	items  map[string]struct{}
	sorted []string
	digest string
}

// NewCapabilities returns the set of items (copied; duplicates and empty
// strings dropped).
func NewCapabilities(items []string) *Capabilities {
	sorted := slices.DeleteFunc(slices.Clone(items), func(s string) bool { return s == "" })
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	c := &Capabilities{items: make(map[string]struct{}, len(sorted)), sorted: sorted}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range sorted {
		c.items[s] = struct{}{}
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	c.digest = hex.EncodeToString(h.Sum(nil))
	return c
}

// Digest returns a hex SHA-256 of the set's content: equal sets have equal
// digests. It is "" for a nil set.
func (c *Capabilities) Digest() string {
	if c == nil {
		return ""
	}
	return c.digest
}

// Items returns the items, sorted (a fresh slice). A database driver
// stores them under the digest.
func (c *Capabilities) Items() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.sorted)
}

// Len returns the number of items.
func (c *Capabilities) Len() int {
	if c == nil {
		return 0
	}
	return len(c.sorted)
}

// Has reports whether the set holds item exactly.
func (c *Capabilities) Has(item string) bool {
	if c == nil {
		return false
	}
	_, ok := c.items[item]
	return ok
}

// Meets reports whether the set meets one need (see [Capabilities] for the
// rule). A nil set meets every need.
func (c *Capabilities) Meets(need string) bool {
	if c == nil {
		return true
	}
	if _, ok := c.items[need]; ok {
		return true
	}
	if key, _, ok := SplitValueNeed(need); ok {
		_, listed := c.items[listCapPrefix+key]
		return !listed
	}
	return false
}

// MeetsAll reports whether the set meets every need.
func (c *Capabilities) MeetsAll(needs []string) bool {
	for _, n := range needs {
		if !c.Meets(n) {
			return false
		}
	}
	return true
}

// Unmet returns the needs the set does not meet, in their order (nil when
// it meets them all).
func (c *Capabilities) Unmet(needs []string) []string {
	var out []string
	for _, n := range needs {
		if !c.Meets(n) {
			out = append(out, n)
		}
	}
	return out
}
