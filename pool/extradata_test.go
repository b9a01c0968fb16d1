package pool_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// A job's EnqueueOpts.ExtraData reaches its prompt's extra_data, with the
// Pool's own entries, exactly as given (a large integer too), also when
// another Pool on the queue runs it: it lives in the job's record. A
// partner-node key given to the backend's client goes in as well, and
// never into the record.
func TestEnqueueExtraData(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := memqueue.New(nil)
		require.NoError(t, err)
		q := queue.New(d)
		t.Cleanup(func() { _ = q.Close() })
		const key = "comfyui-partner-0123456789"
		var posted [][]byte
		front := poolOn(t, q, "front", 0, nil) // enqueues; runs nothing
		back := poolOn(t, q, "back", 1, func(c *pool.Config) {
			c.Backends[0].Client.ComfyOrgAPIKey = key
			hc := *c.Backends[0].Client.HTTPClient
			hc.Transport = &bodyTap{base: hc.Transport, path: "/prompt", bodies: &posted}
			c.Backends[0].Client.HTTPClient = &hc
		})
		require.NoError(t, front.pool.Start(t.Context()))
		extra := map[string]any{
			"extra_pnginfo":  map[string]any{"workflow": map[string]any{"id": "w-1", "nodes": []any{}}},
			"preview_method": "auto",
			"big":            json.Number("9007199254740993"), // 2^53 + 1: not a float64
		}
		id, err := front.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{ExtraData: extra})
		require.NoError(t, err)
		require.NoError(t, back.pool.Start(t.Context()))
		_, err = front.pool.Wait(t.Context(), id)
		require.NoError(t, err)

		ps := back.servers[0].Prompts()
		require.Len(t, ps, 1)
		got := ps[0].ExtraData
		assert.Equal(t, map[string]any{"workflow": map[string]any{"id": "w-1", "nodes": []any{}}}, got["extra_pnginfo"])
		assert.Equal(t, "auto", got["preview_method"])
		assert.Equal(t, id, got["comfypool_job"])
		assert.Equal(t, key, got[comfy.ExtraComfyOrgAPIKey])
		assert.Equal(t, ps[0].ClientID, got["client_id"])
		require.Len(t, posted, 1)
		var body struct {
			ExtraData map[string]json.RawMessage `json:"extra_data"`
		}
		require.NoError(t, json.Unmarshal(posted[0], &body))
		assert.Equal(t, "9007199254740993", string(body.ExtraData["big"]), "sent as it was encoded")

		qj, err := q.Get(t.Context(), id)
		require.NoError(t, err)
		assert.NotContains(t, string(qj.Payload), key)
		assert.Contains(t, string(qj.Payload), "w-1")
	})
}

// Credentials and the keys the Pool sets cannot be given as extra data,
// nor data that does not encode as JSON: Enqueue fails with ErrInvalid
// and enqueues nothing.
func TestEnqueueExtraDataRefused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		for _, extra := range []map[string]any{
			{comfy.ExtraComfyOrgAPIKey: "comfyui-x"},
			{comfy.ExtraComfyOrgAuthToken: "t"},
			{"client_id": "c"},
			{"comfypool_job": "j"},
			{"ch": make(chan int)},
		} {
			_, err := b.pool.Enqueue(t.Context(), mustWF(t, comfytest.WorkflowOK), &pool.EnqueueOpts{ExtraData: extra})
			require.ErrorIs(t, err, pool.ErrInvalid, "%v", extra)
			assert.NotContains(t, err.Error(), "comfyui-x")
		}
		page, err := b.pool.List(t.Context(), pool.ListFilter{})
		require.NoError(t, err)
		assert.Empty(t, page.Jobs)
	})
}

// bodyTap records the bodies of the requests to path.
type bodyTap struct {
	base   http.RoundTripper
	path   string
	bodies *[][]byte
}

func (b *bodyTap) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == b.path && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		*b.bodies = append(*b.bodies, body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return b.base.RoundTrip(r)
}
