package comfy

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// promptRequestReflect is PromptRequest.MarshalJSON as it was before
// appendJSON: encoding/json on the struct of the server's field names.
func promptRequestReflect(r *PromptRequest) ([]byte, error) {
	return json.Marshal(struct {
		Prompt                  Workflow       `json:"prompt"`
		ClientID                string         `json:"client_id,omitempty"`
		PromptID                string         `json:"prompt_id,omitempty"`
		ExtraData               map[string]any `json:"extra_data,omitempty"`
		Front                   bool           `json:"front,omitempty"`
		Number                  *float64       `json:"number,omitempty"`
		PartialExecutionTargets []string       `json:"partial_execution_targets,omitempty"`
	}{r.Prompt, r.ClientID, r.PromptID, r.ExtraData, r.Front, r.Number, r.PartialExecutionTargets})
}

// jsonValueCases are input values of every kind a workflow may hold.
func jsonValueCases() []any {
	return []any{
		nil, true, false, "", "plain", "a<b>&c", `q"uote\`, "é ü", "emoji 😀", "\u2028\u2029", "\x00\x1f\n\t\b\f", "bad \xff",
		0, -7, 1 << 40, int64(math.MinInt64), int8(-3), uint64(math.MaxUint64), uint8(200),
		0.0, math.Copysign(0, -1), 1.0, 1.5, -2.25, 1e20, 1e21, 123456789e15, 1e-6, 1e-7, 1.5e-7, 123456789.125,
		-1e-300, math.MaxFloat64, 5e-324, float32(1.1), float32(1e-7),
		json.Number("12.50"), json.Number("18446744073709551615"), json.Number("-1e-9"), json.Number(""),
		Link{NodeID: "4", Output: 1}, Link{NodeID: "<a>", Output: 0}, &Link{NodeID: "2"}, (*Link)(nil),
		[]string{"a", "<b>"}, []string(nil), []string{}, []any(nil), []any{}, []any{"1", 0}, []any{1.5, []any{nil, "x"}},
		map[string]any(nil), map[string]any{}, map[string]any{"b": 1, "a": map[string]any{"z": []any{}, "é": "<"}},
		map[string]string{"k": "v"}, struct {
			A int
			B string `json:"b,omitempty"`
		}{A: 3},
	}
}

// promptRequestCases are requests of every shape.
func promptRequestCases(t testing.TB) []*PromptRequest {
	t.Helper()
	var out []*PromptRequest
	for _, data := range workflowCases(t) {
		if w, err := ParseWorkflow(data); err == nil {
			out = append(out, &PromptRequest{Prompt: w})
		}
	}
	inputs := map[string]any{}
	for i, v := range jsonValueCases() {
		inputs[string(rune('a'+i%26))+string(rune('a'+i/26))] = v
		out = append(out, &PromptRequest{Prompt: Workflow{"1": {ClassType: "X", Inputs: map[string]any{"v": v}}}})
	}
	n := 1.5
	nan := math.NaN()
	out = append(out,
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X", Inputs: inputs}, "10": {ClassType: "Y<>"}, "2": {ClassType: "Z", Inputs: map[string]any{}, Meta: &NodeMeta{}},
			"é": {ClassType: "W", Meta: &NodeMeta{Title: "T&"}}}},
		&PromptRequest{}, &PromptRequest{Prompt: Workflow{}},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X"}}, ClientID: "c", PromptID: "p<", ExtraData: map[string]any{"k": []any{1}}, Front: true, Number: &n,
			PartialExecutionTargets: []string{"9", "10"}},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X"}}, ExtraData: map[string]any{}, PartialExecutionTargets: []string{}},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X"}}, Number: &nan},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X", Inputs: map[string]any{"a": math.Inf(1)}}}},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X", Inputs: map[string]any{"a": json.Number("01")}}}},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X", Inputs: map[string]any{"a": make(chan int)}}}},
		&PromptRequest{Prompt: Workflow{"1": {ClassType: "X"}}, ExtraData: map[string]any{"f": func() {}}},
	)
	many := Workflow{}
	for i := range 40 {
		many[string(rune('A'+i))] = Node{ClassType: "X", Inputs: map[string]any{"i": i}}
	}
	return append(out, &PromptRequest{Prompt: many})
}

// TestPromptRequestJSON: a POST /prompt body is written byte for byte as
// encoding/json wrote it, and fails where it failed, with its error.
func TestPromptRequestJSON(t *testing.T) {
	for _, r := range promptRequestCases(t) {
		checkPromptRequestJSON(t, r)
	}
}

func checkPromptRequestJSON(t *testing.T, r *PromptRequest) {
	t.Helper()
	want, wantErr := promptRequestReflect(r)
	got, err := r.MarshalJSON()
	if wantErr != nil {
		require.Error(t, err, "%s", want)
		assert.Equal(t, wantErr.Error(), err.Error())
		_, viaMarshal := json.Marshal(r)
		assert.Equal(t, viaMarshal.Error(), (&json.MarshalerError{Type: reflect.TypeFor[*PromptRequest](), Err: err}).Error(),
			"QueuePrompt's error is json.Marshal's")
		return
	}
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
}

func FuzzPromptRequestJSON(f *testing.F) {
	for _, data := range workflowCases(f) {
		f.Add(data, "c", 1.5)
	}
	f.Fuzz(func(t *testing.T, data []byte, id string, number float64) {
		w, err := ParseWorkflow(data)
		if err != nil {
			return
		}
		checkPromptRequestJSON(t, &PromptRequest{Prompt: w, ClientID: id, PromptID: id, ExtraData: map[string]any{id: number}, Number: &number})
	})
}

// BenchmarkPromptRequestJSON encodes the POST /prompt body of
// bench.Job's workflow: as QueuePrompt does, and with encoding/json as
// it did (json.Marshal of the request, which compacts what MarshalJSON
// gave it).
func BenchmarkPromptRequestJSON(b *testing.B) {
	w, err := ParseWorkflow(workflowCases(b)[1])
	require.NoError(b, err)
	r := &PromptRequest{Prompt: w, ClientID: "1d10c0158fcc4a43af0f574ce0bf0b30", PromptID: "82a663cf-7f2c-4582-9f99-553cf3958f58"}
	for _, enc := range []struct {
		name string
		f    func() ([]byte, error)
	}{
		{"direct", r.marshal},
		{"reflect", func() ([]byte, error) {
			b, err := promptRequestReflect(r)
			if err != nil {
				return nil, err
			}
			return json.Marshal(json.RawMessage(b))
		}},
	} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := enc.f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
