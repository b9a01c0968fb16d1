package dag

import (
	"encoding/json"
	"fmt"
)

// The argument checks of the Store contract. Every Store rejects the same
// arguments with the same errors, all matching ErrInvalid, before it
// writes anything: MemoryStore and FileStore call these functions, and so
// should a Store written elsewhere (the PostgreSQL and Redis ones do).
// Values inside records stay opaque: only their being JSON is checked.

// CheckExecutionRecord returns an error matching ErrInvalid when a Store
// cannot keep rec: rec is nil, has no ID, or its Graph or Inputs are not
// empty and not valid JSON.
func CheckExecutionRecord(rec *ExecutionRecord) error {
	switch {
	case rec == nil:
		return fmt.Errorf("%w: nil execution record", ErrInvalid)
	case rec.ID == "":
		return fmt.Errorf("%w: execution record without an id", ErrInvalid)
	case !validRaw(rec.Graph):
		return fmt.Errorf("%w: execution %q: graph: not valid JSON", ErrInvalid, rec.ID)
	case !validRaw(rec.Inputs):
		return fmt.Errorf("%w: execution %q: inputs: not valid JSON", ErrInvalid, rec.ID)
	}
	return nil
}

// CheckNodeRecord returns an error matching ErrInvalid when a Store
// cannot keep rec as a node record of execution id: id is empty, rec is
// nil or has no Node, or its Outputs are not empty and not valid JSON.
func CheckNodeRecord(id string, rec *NodeRecord) error {
	switch {
	case rec == nil:
		return fmt.Errorf("%w: execution %q: nil node record", ErrInvalid, id)
	case id == "":
		return fmt.Errorf("%w: node record %q for an execution without an id", ErrInvalid, rec.Node)
	case rec.Node == "":
		return fmt.Errorf("%w: execution %q: node record without a node id", ErrInvalid, id)
	case !validRaw(rec.Outputs):
		return fmt.Errorf("%w: execution %q: node %q: outputs: not valid JSON", ErrInvalid, id, rec.Node)
	}
	return nil
}

// LatestNodeRecords checks recs with CheckNodeRecord and returns the
// latest record of each node, in the order the nodes first appear in
// recs: what saving recs one after the other leaves, as
// BatchStore.SaveNodes must, in a form that one write touching each node
// once can take. It returns recs' own records, not copies; for no
// records, an empty slice.
func LatestNodeRecords(id string, recs []*NodeRecord) ([]*NodeRecord, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: node records for an execution without an id", ErrInvalid)
	}
	first := make(map[string]int, len(recs)) // node -> its index in out
	out := make([]*NodeRecord, 0, len(recs))
	for _, rec := range recs {
		if err := CheckNodeRecord(id, rec); err != nil {
			return nil, err
		}
		if k, ok := first[rec.Node]; ok {
			out[k] = rec
			continue
		}
		first[rec.Node] = len(out)
		out = append(out, rec)
	}
	return out, nil
}

// CheckLease returns an error matching ErrInvalid for a lease without an
// Owner or whose TTL is not positive.
func CheckLease(l Lease) error {
	if err := CheckLeaseOwner(l.Owner); err != nil {
		return err
	}
	if l.TTL <= 0 {
		return fmt.Errorf("%w: lease TTL %v is not positive", ErrInvalid, l.TTL)
	}
	return nil
}

// CheckLeaseOwner returns an error matching ErrInvalid for the empty
// owner of a leased write (LeaseStore.UpdateExecutionLeased,
// SaveNodesLeased), which no lease has.
func CheckLeaseOwner(owner string) error {
	if owner == "" {
		return fmt.Errorf("%w: lease without an owner", ErrInvalid)
	}
	return nil
}

// CheckMemoValue returns an error matching ErrInvalid when value, for
// Store.SaveMemo, is not empty and not valid JSON.
func CheckMemoValue(value json.RawMessage) error {
	if !validRaw(value) {
		return fmt.Errorf("%w: memo value: not valid JSON", ErrInvalid)
	}
	return nil
}

// validRaw reports whether raw is empty (no value) or valid JSON.
func validRaw(raw json.RawMessage) bool {
	return len(raw) == 0 || json.Valid(raw)
}
