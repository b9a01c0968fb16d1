package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// job is one job of a run: the workflow with its overrides.
type job struct {
	name      string // job-0001: names its output files and its log lines
	line      int    // its line in the batch file; 0 without a batch
	overrides []pool.Override
}

// maxBatchLine bounds one line of a batch file.
const maxBatchLine = 16 << 20

// parseOverrides parses one line of a batch file: either an object of
// "<node>.<input>": value ({"6.text": "a cat", "3.seed": 42}; the input is
// what follows the last dot), or a list of pool.Override
// ([{"node": "6", "input": "text", "value": "a cat"}]). Numbers keep every
// digit (json.Number), so 64-bit seeds survive. The overrides come out in
// a stable order: as listed, or by node and input for the object form.
func parseOverrides(line []byte) ([]pool.Override, error) {
	line = bytes.TrimSpace(line)
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var out []pool.Override
	switch {
	case len(line) > 0 && line[0] == '{':
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			return nil, fmt.Errorf("not a JSON object: %w", err)
		}
		for k, v := range m {
			i := strings.LastIndexByte(k, '.')
			if i <= 0 || i == len(k)-1 {
				return nil, fmt.Errorf("key %q is not <node>.<input>", k)
			}
			out = append(out, pool.Override{Node: k[:i], Input: k[i+1:], Value: v})
		}
		slices.SortFunc(out, func(a, b pool.Override) int {
			return strings.Compare(a.Node+"\x00"+a.Input, b.Node+"\x00"+b.Input)
		})
	case len(line) > 0 && line[0] == '[':
		if err := dec.Decode(&out); err != nil {
			return nil, fmt.Errorf("not a JSON list of overrides: %w", err)
		}
		for i, o := range out {
			if o.Node == "" || o.Input == "" {
				return nil, fmt.Errorf("override %d: node and input are required", i)
			}
		}
	default:
		return nil, errors.New(`want a JSON object {"<node>.<input>": value, ...} or a list [{"node": ..., "input": ..., "value": ...}, ...]`)
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value on the line")
	}
	return out, nil
}

// checkOverrides checks that overrides can apply to wf, as
// pool.EnqueueTemplate would: the node exists and the input is not a link.
func checkOverrides(wf comfy.Workflow, ovr []pool.Override) error {
	for _, o := range ovr {
		n, ok := wf[o.Node]
		if !ok {
			return fmt.Errorf("no node %q in the workflow", o.Node)
		}
		if _, isLink := comfy.AsLink(n.Inputs[o.Input]); isLink {
			return fmt.Errorf("node %q input %q is a link, not a value", o.Node, o.Input)
		}
	}
	return nil
}

// readJobs returns the jobs of a run: each line of batch (JSON Lines; blank
// lines skipped) is a job, or, with batch nil, one job without overrides;
// every job count times. Each job's overrides are checked against wf. An
// error names the line.
func readJobs(wf comfy.Workflow, batch io.Reader, count int) ([]job, error) {
	var base []job
	if batch == nil {
		base = []job{{}}
	} else {
		sc := bufio.NewScanner(batch)
		sc.Buffer(make([]byte, 0, 64<<10), maxBatchLine)
		for n := 1; sc.Scan(); n++ {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			ovr, err := parseOverrides(sc.Bytes())
			if err == nil {
				err = checkOverrides(wf, ovr)
			}
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			base = append(base, job{line: n, overrides: ovr})
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
		if len(base) == 0 {
			return nil, errors.New("no jobs: the batch file has no lines")
		}
	}
	jobs := make([]job, 0, len(base)*count)
	for range count {
		jobs = append(jobs, base...)
	}
	width := len(fmt.Sprint(len(jobs)))
	for i := range jobs {
		jobs[i].name = fmt.Sprintf("job-%0*d", max(width, 4), i+1)
	}
	return jobs, nil
}

// varySeed sets input key ("<node>.<input>") of every job to the job's
// number (1, 2, ...), unless the job's overrides set it: jobs that would be
// the same (-count) then differ, and a server runs each instead of
// answering from its cache.
func varySeed(wf comfy.Workflow, jobs []job, key string) error {
	i := strings.LastIndexByte(key, '.')
	if i <= 0 || i == len(key)-1 {
		return fmt.Errorf("%q is not <node>.<input>", key)
	}
	node, input := key[:i], key[i+1:]
	if err := checkOverrides(wf, []pool.Override{{Node: node, Input: input}}); err != nil {
		return err
	}
	for n := range jobs {
		j := &jobs[n]
		if !slices.ContainsFunc(j.overrides, func(o pool.Override) bool { return o.Node == node && o.Input == input }) {
			j.overrides = append(slices.Clip(j.overrides), pool.Override{Node: node, Input: input, Value: n + 1})
		}
	}
	return nil
}
