package comfy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
)

// QueueItem is one prompt in GET /queue: the server's tuple
// [number, prompt_id, prompt, extra_data, outputs_to_execute].
type QueueItem struct {
	Number           float64
	PromptID         string
	Prompt           json.RawMessage
	ExtraData        map[string]json.RawMessage
	OutputsToExecute []string
}

// QueueState is the server's queue. Running holds at most one item (the
// server has one worker); Pending is sorted in run order, by (Number,
// PromptID).
type QueueState struct {
	Running, Pending []QueueItem
}

// Find reports whether promptID is running or pending.
func (q *QueueState) Find(promptID string) (running, pending bool) {
	if q == nil {
		return false, false
	}
	for _, it := range q.Running {
		if it.PromptID == promptID {
			return true, false
		}
	}
	for _, it := range q.Pending {
		if it.PromptID == promptID {
			return false, true
		}
	}
	return false, false
}

// Queue returns the running and pending prompts (GET /queue).
func (c *Client) Queue(ctx context.Context) (*QueueState, error) {
	var w struct {
		Running []json.RawMessage `json:"queue_running"`
		Pending []json.RawMessage `json:"queue_pending"`
	}
	r := request{method: http.MethodGet, path: "/queue"}
	if err := c.call(ctx, r, c.bigLimit(), &w); err != nil {
		return nil, err
	}
	q, err := decodeQueueState(w.Running, w.Pending, c.cloud())
	if err != nil {
		return nil, c.badResponse("GET "+c.prefix()+"/queue", err.Error())
	}
	return q, nil
}

// decodeQueueState decodes the two lists of GET /queue; cloud reads the
// items in Comfy Cloud's order (see decodeQueueItem).
func decodeQueueState(running, pending []json.RawMessage, cloud bool) (*QueueState, error) {
	decode := decodeQueueItem
	if cloud {
		decode = decodeCloudQueueItem
	}
	q := &QueueState{}
	for i, raw := range running {
		it, err := decode(raw)
		if err != nil {
			return nil, fmt.Errorf("queue_running[%d]: %w", i, err)
		}
		q.Running = append(q.Running, it)
	}
	for i, raw := range pending {
		it, err := decode(raw)
		if err != nil {
			return nil, fmt.Errorf("queue_pending[%d]: %w", i, err)
		}
		q.Pending = append(q.Pending, it)
	}
	sort.SliceStable(q.Pending, func(i, j int) bool {
		a, b := q.Pending[i], q.Pending[j]
		if a.Number != b.Number {
			return a.Number < b.Number
		}
		return a.PromptID < b.PromptID
	})
	return q, nil
}

// decodeQueueItem decodes the tuple [number, prompt_id, prompt, extra_data,
// outputs_to_execute]. Only indexes 0 to 4 are read: newer servers may add
// elements. An item that is not a list, or has no prompt id, is an error;
// the other elements are decoded leniently (a number of another shape is 0,
// extra_data that is not an object is nil, see lenient.go).
func decodeQueueItem(raw []byte) (QueueItem, error) {
	var t []json.RawMessage
	if err := json.Unmarshal(raw, &t); err != nil {
		return QueueItem{}, errors.New("queue item is not a list")
	}
	if len(t) < 2 {
		return QueueItem{}, fmt.Errorf("queue item has %d elements, want 5", len(t))
	}
	var id lstr
	_ = id.UnmarshalJSON(t[1])
	if id == "" {
		return QueueItem{}, errors.New("queue item has no prompt id")
	}
	var number lfloat
	_ = number.UnmarshalJSON(t[0])
	it := QueueItem{Number: float64(number), PromptID: string(id)}
	if len(t) > 2 && !isNull(t[2]) {
		it.Prompt = t[2]
	}
	if len(t) > 3 {
		var extra lobject
		_ = extra.UnmarshalJSON(t[3])
		it.ExtraData = extra
	}
	if len(t) > 4 {
		var outs lstrs
		_ = outs.UnmarshalJSON(t[4])
		it.OutputsToExecute = outs
	}
	return it, nil
}

// decodeCloudQueueItem decodes an item of Comfy Cloud's GET /api/queue,
// [number, prompt_id, workflow, output_node_ids, metadata]: its fourth
// element is the output node ids, and there is no extra_data.
func decodeCloudQueueItem(raw []byte) (QueueItem, error) {
	it, err := decodeQueueItem(raw)
	if err != nil {
		return it, err
	}
	var t []json.RawMessage
	_ = json.Unmarshal(raw, &t) // a list: decodeQueueItem checked
	it.ExtraData, it.OutputsToExecute = nil, nil
	if len(t) > 3 {
		var outs lstrs
		_ = outs.UnmarshalJSON(t[3])
		it.OutputsToExecute = outs
	}
	return it, nil
}

// DeleteQueued removes pending prompts (POST /queue {"delete": ids}). A
// running or unknown id is silently ignored by the server: use [Client.Interrupt]
// for a running prompt. No ids sends nothing.
//
// A prompt of this Client deleted this way ends with an error wrapping
// [ErrInterrupted] (not [ErrPromptRemoved]: the deletion was asked for).
func (c *Client) DeleteQueued(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return c.checkClosed("POST " + c.prefix() + "/queue")
	}
	c.sess.markDeleted(func(p *Prompt) bool { return slices.Contains(ids, p.id) })
	r, err := jsonRequest(http.MethodPost, "/queue", map[string][]string{"delete": ids})
	if err != nil {
		return err
	}
	return c.call(ctx, r, c.smallLimit(), nil)
}

// ClearQueue removes every pending prompt (POST /queue {"clear": true}),
// of every client of the server. The running prompt is not touched. The
// pending prompts of this Client end with an error wrapping
// [ErrInterrupted].
func (c *Client) ClearQueue(ctx context.Context) error {
	c.sess.markDeleted(func(p *Prompt) bool { return !p.started })
	r, err := jsonRequest(http.MethodPost, "/queue", map[string]bool{"clear": true})
	if err != nil {
		return err
	}
	return c.call(ctx, r, c.smallLimit(), nil)
}

// CancelPrompt makes sure the prompt promptID does not run, or stops it,
// whether or not this client tracks it: a pending prompt is deleted from
// the queue, a running one gets a targeted interrupt (another prompt is
// never interrupted), and a prompt the server does not have, or that
// already ended, is left alone. An empty promptID does nothing.
//
// It is meant for a prompt whose POST /prompt got no answer (the client
// gave up waiting, or the connection failed), so that whether the server
// queued it is unknown. Such a POST may still land after CancelPrompt
// looked: the client therefore remembers promptID for a while (about two
// minutes), and if the server reports on this client's WebSocket that the
// prompt started, the client cancels it then, in the background.
// Submitting promptID again through [Client.Submit] ends that watch. For
// a [Prompt] that Submit returned, use [Prompt.Interrupt] instead.
//
// CancelPrompt reports whether its requests were sent, not whether the
// server honoured them (a server may ignore interrupts).
func (c *Client) CancelPrompt(ctx context.Context, promptID string) error {
	if promptID == "" {
		return nil
	}
	c.sess.watchCancelled(promptID)
	return c.cancelPrompt(ctx, promptID)
}

// cancelPrompt deletes id from the queue and, if the server reports it
// running, interrupts it.
func (c *Client) cancelPrompt(ctx context.Context, id string) error {
	for range 3 {
		if err := c.DeleteQueued(ctx, id); err != nil {
			return fmt.Errorf("comfy: cancel prompt %s: %w", id, err)
		}
		q, err := c.Queue(ctx)
		if err != nil {
			return fmt.Errorf("comfy: cancel prompt %s: %w", id, err)
		}
		running, pending := q.Find(id)
		switch {
		case running:
			if err := c.Interrupt(ctx, id); err != nil {
				return fmt.Errorf("comfy: cancel prompt %s: %w", id, err)
			}
			return nil
		case pending:
			continue // it landed between the delete and the look
		default:
			return nil
		}
	}
	return fmt.Errorf("comfy: cancel prompt %s: still queued after delete", id)
}

// markDeleted notes, before the request, that this Client asks the server
// to delete the tracked prompts selected by sel (called with the prompt's
// lock held), so that their disappearance from the queue reads as an
// interruption asked for, not a removal by someone else.
func (s *session) markDeleted(sel func(p *Prompt) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.prompts {
		p.mu.Lock()
		if sel(p) {
			p.deleted = true
		}
		p.mu.Unlock()
	}
}
