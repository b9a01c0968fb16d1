package dag_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/dag"
)

// LatestNodeRecords keeps the latest record of each node, where the node
// first appeared, and checks every record, the replaced ones included.
func TestLatestNodeRecords(t *testing.T) {
	t.Parallel()
	a1, b, a2, c := &dag.NodeRecord{Node: "a", Runs: 1}, &dag.NodeRecord{Node: "b"}, &dag.NodeRecord{Node: "a", Runs: 2}, &dag.NodeRecord{Node: "c"}
	got, err := dag.LatestNodeRecords("e", []*dag.NodeRecord{a1, b, a2, c})
	require.NoError(t, err)
	assert.Equal(t, []*dag.NodeRecord{a2, b, c}, got)

	got, err = dag.LatestNodeRecords("e", nil)
	require.NoError(t, err)
	assert.NotNil(t, got, "no records: an empty slice, which encodes as [] (not null)")
	assert.Empty(t, got)

	bad := &dag.NodeRecord{Node: "a", Outputs: json.RawMessage(`{`)}
	for name, recs := range map[string][]*dag.NodeRecord{
		"replaced record not JSON": {bad, a2},
		"nil record":               {a1, nil},
		"record without a node":    {{}},
	} {
		_, err := dag.LatestNodeRecords("e", recs)
		assert.ErrorIs(t, err, dag.ErrInvalid, name)
	}
	_, err = dag.LatestNodeRecords("", nil)
	assert.ErrorIs(t, err, dag.ErrInvalid, "execution without an id")
}
