package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// testEnv is an env with the given environment variables and buffers for
// its output.
func testEnv(vars map[string]string) (*env, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}, &out, &errb
}

func TestParseOverrides(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, line string
		want       []pool.Override
		err        string
	}{
		{name: "object", line: `{"6.text": "a cat", "3.seed": 42}`, want: []pool.Override{
			{Node: "3", Input: "seed", Value: json.Number("42")}, {Node: "6", Input: "text", Value: "a cat"}}},
		{name: "a 64-bit seed keeps its digits", line: `{"3.seed": 18446744073709551615}`, want: []pool.Override{
			{Node: "3", Input: "seed", Value: json.Number("18446744073709551615")}}},
		{name: "the input follows the last dot", line: `{"sub.7.cfg": 7.5}`, want: []pool.Override{
			{Node: "sub.7", Input: "cfg", Value: json.Number("7.5")}}},
		{name: "list, in its order", line: ` [{"node": "6", "input": "text", "value": "a dog"}, {"node": "3", "input": "seed", "value": 1}] `, want: []pool.Override{
			{Node: "6", Input: "text", Value: "a dog"}, {Node: "3", Input: "seed", Value: json.Number("1")}}},
		{name: "values of any JSON type", line: `{"1.flag": true, "1.list": [1, "a"], "1.none": null}`, want: []pool.Override{
			{Node: "1", Input: "flag", Value: true}, {Node: "1", Input: "list", Value: []any{json.Number("1"), "a"}}, {Node: "1", Input: "none", Value: nil}}},
		{name: "empty object", line: `{}`, want: nil},
		{name: "key without a dot", line: `{"seed": 1}`, err: `key "seed" is not <node>.<input>`},
		{name: "key without an input", line: `{"3.": 1}`, err: `is not <node>.<input>`},
		{name: "key without a node", line: `{".seed": 1}`, err: `is not <node>.<input>`},
		{name: "list entry without input", line: `[{"node": "3", "value": 1}]`, err: "override 0: node and input are required"},
		{name: "not JSON", line: `{"3.seed": }`, err: "not a JSON object"},
		{name: "a number", line: `42`, err: "want a JSON object"},
		{name: "two values", line: `{"3.seed": 1} {"3.seed": 2}`, err: "more than one JSON value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOverrides([]byte(tc.line))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReadJobs(t *testing.T) {
	t.Parallel()
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowSampler)
	require.NoError(t, err)

	jobs, err := readJobs(wf, nil, 3)
	require.NoError(t, err)
	require.Len(t, jobs, 3)
	assert.Equal(t, []string{"job-0001", "job-0002", "job-0003"}, []string{jobs[0].name, jobs[1].name, jobs[2].name})
	assert.Empty(t, jobs[0].overrides)

	batch := "{\"2.seed\": 1}\n\n[{\"node\": \"2\", \"input\": \"steps\", \"value\": 8}]\n"
	jobs, err = readJobs(wf, strings.NewReader(batch), 2)
	require.NoError(t, err)
	require.Len(t, jobs, 4, "two lines (the blank one skipped), twice")
	assert.Equal(t, []int{1, 3, 1, 3}, []int{jobs[0].line, jobs[1].line, jobs[2].line, jobs[3].line})
	assert.Equal(t, "job-0004", jobs[3].name)
	assert.Equal(t, []pool.Override{{Node: "2", Input: "steps", Value: json.Number("8")}}, jobs[3].overrides)

	many := strings.Repeat("{\"2.seed\": 1}\n", 10001)
	jobs, err = readJobs(wf, strings.NewReader(many), 1)
	require.NoError(t, err)
	assert.Equal(t, "job-00001", jobs[0].name, "names are as wide as the last one")
	assert.Equal(t, "job-10001", jobs[10000].name)

	for batch, want := range map[string]string{
		"{\"2.seed\": 1}\n{\"9.seed\": 1}\n": `line 2: no node "9" in the workflow`,
		"{\"2.model\": 1}\n":                 `line 1: node "2" input "model" is a link, not a value`,
		"{\"2.seed\": 1}\nnot json\n":        "line 2: want a JSON object",
		"\n\n":                               "no jobs",
	} {
		_, err := readJobs(wf, strings.NewReader(batch), 1)
		assert.ErrorContains(t, err, want, "batch %q", batch)
	}
}

// -vary-seed sets an input to each job's number, unless its batch line
// sets it.
func TestVarySeed(t *testing.T) {
	t.Parallel()
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowSampler)
	require.NoError(t, err)
	jobs, err := readJobs(wf, strings.NewReader("{\"2.steps\": 8}\n{\"2.seed\": 99}\n"), 2)
	require.NoError(t, err)
	require.NoError(t, varySeed(wf, jobs, "2.seed"))
	var seeds []any
	for _, j := range jobs {
		for _, o := range j.overrides {
			if o.Node == "2" && o.Input == "seed" {
				seeds = append(seeds, o.Value)
			}
		}
	}
	assert.Equal(t, []any{1, json.Number("99"), 3, json.Number("99")}, seeds)
	assert.Len(t, jobs[0].overrides, 2, "the line's own override is kept")
	assert.Len(t, jobs[2].overrides, 2, "jobs repeated by -count do not share their overrides")

	assert.ErrorContains(t, varySeed(wf, jobs, "seed"), "is not <node>.<input>")
	assert.ErrorContains(t, varySeed(wf, jobs, "9.seed"), `no node "9"`)
	assert.ErrorContains(t, varySeed(wf, jobs, "2.model"), "is a link")
}

func TestParseServer(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]server{
		"http://10.0.0.1:8188":        {name: "10.0.0.1:8188", url: "http://10.0.0.1:8188"},
		"127.0.0.1:8188":              {name: "127.0.0.1:8188", url: "http://127.0.0.1:8188"},
		"gpu-1=http://10.0.0.1:8188/": {name: "gpu-1", url: "http://10.0.0.1:8188"},
		"https://comfy.example/proxy": {name: "comfy.example", url: "https://comfy.example/proxy"},
		"http://h:1/?token=a=b":       {name: "h:1", url: "http://h:1/?token=a=b"},
	} {
		got, err := parseServer(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"ftp://h:1", "gpu=", "http://", "gpu-1=http://%zz"} {
		_, err := parseServer(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseRunArgs(t *testing.T) {
	t.Parallel()
	e, _, _ := testEnv(map[string]string{"COMFYPOOL_SERVERS": "a=http://h1:1,b=http://h2:2", "COMFYPOOL_OUT": "/tmp/o", "COMFYPOOL_ATTEMPTS": "5"})
	c, err := parseRunArgs(e, []string{"wf.json"})
	require.NoError(t, err)
	assert.Equal(t, []server{{"a", "http://h1:1"}, {"b", "http://h2:2"}}, c.servers, "from $COMFYPOOL_SERVERS")
	assert.Equal(t, "/tmp/o", c.out)
	assert.Equal(t, 5, c.attempts)
	assert.Equal(t, "wf.json", c.workflow)

	c, err = parseRunArgs(e, []string{"-server", "c=http://h3:3", "-server", "h4:4,h5:5", "-out", "x", "-count", "4", "-batch", "b.jsonl", "wf.json"})
	require.NoError(t, err)
	assert.Equal(t, []server{{"c", "http://h3:3"}, {"h4:4", "http://h4:4"}, {"h5:5", "http://h5:5"}}, c.servers, "the command line replaces the environment")
	assert.Equal(t, "x", c.out)
	assert.Equal(t, 4, c.count)
	assert.Equal(t, "b.jsonl", c.batch)

	_, err = parseRunArgs(e, []string{"wf.json", "-count", "3", "--", "-x"})
	require.ErrorContains(t, err, `one workflow file expected, got ["wf.json" "-x"]`, "flags may follow the workflow; after -- all are arguments")
	c, err = parseRunArgs(e, []string{"wf.json", "-count", "3"})
	require.NoError(t, err)
	assert.Equal(t, 3, c.count, "a flag after the workflow")
	assert.Equal(t, "wf.json", c.workflow)

	e, _, _ = testEnv(nil)
	c, err = parseRunArgs(e, []string{"-fake-fail-rate", "0.25", "-fake-sampler-duration", "2s", "-fakes", "2"})
	require.NoError(t, err)
	assert.Empty(t, c.servers)
	assert.Empty(t, c.workflow, "no workflow with fakes: the demo")
	assert.Equal(t, 2, c.fakes)
	assert.InDelta(t, 0.25, float64(c.fake.failRate), 0)
	assert.Equal(t, 2*time.Second, c.fake.sampler)
	assert.Equal(t, "comfypool-out", c.out)
	assert.Equal(t, 5*time.Second, c.connectTimeout)

	for _, tc := range []struct {
		vars map[string]string
		args []string
		err  string
	}{
		{args: []string{"-server", "h:1"}, err: "a workflow file is required with -server"},
		{args: []string{"-batch", "b"}, err: "a workflow file is required with -batch"},
		{args: []string{"a.json", "b.json"}, err: "one workflow file expected"},
		{args: []string{"-server", "h:1", "-server", "h:1", "w"}, err: `two servers named "h:1"`},
		{args: []string{"-count", "0", "w"}, err: "-count must be at least 1"},
		{args: []string{"-fake-fail-rate", "2"}, err: "must be between 0 and 1"},
		{args: []string{"-fake-steps", "-1"}, err: "-fake-steps cannot be negative"},
		{args: []string{"-nope"}, err: "flag provided but not defined: -nope"},
		{args: []string{"-", "-batch", "-"}, err: "cannot both be stdin"},
		{vars: map[string]string{"COMFYPOOL_ATTEMPTS": "many"}, err: "$COMFYPOOL_ATTEMPTS: parse error"},
		{vars: map[string]string{"COMFYPOOL_CONNECT_TIMEOUT": "0s"}, err: "-connect-timeout must be positive"},
	} {
		e, _, _ := testEnv(tc.vars)
		_, err := parseRunArgs(e, tc.args)
		var ue *usageError
		require.ErrorAs(t, err, &ue, "%v %v", tc.vars, tc.args)
		assert.ErrorContains(t, err, tc.err)
	}
}

func TestParseFakeArgs(t *testing.T) {
	t.Parallel()
	e, _, _ := testEnv(nil)
	c, err := parseFakeArgs(e, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:8188"}, c.listenAddrs())

	c, err = parseFakeArgs(e, []string{"-n", "3", "-port", "9000", "-addr", "0.0.0.0"})
	require.NoError(t, err)
	assert.Equal(t, []string{"0.0.0.0:9000", "0.0.0.0:9001", "0.0.0.0:9002"}, c.listenAddrs())

	c, err = parseFakeArgs(e, []string{"-n", "2", "-port", "0"})
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:0", "127.0.0.1:0"}, c.listenAddrs(), "port 0: a free port each")

	c, err = parseFakeArgs(e, []string{"-ports", "8188,9000", "-n", "5"})
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:8188", "127.0.0.1:9000"}, c.listenAddrs(), "-ports wins over -n")

	e, _, _ = testEnv(map[string]string{"COMFYPOOL_FAKE_N": "2", "COMFYPOOL_FAKE_PORT": "7000", "COMFYPOOL_FAKE_ADDR": "::1"})
	c, err = parseFakeArgs(e, []string{"-fail-rate", "0.1", "-restart-every", "1m"})
	require.NoError(t, err)
	assert.Equal(t, []string{"[::1]:7000", "[::1]:7001"}, c.listenAddrs())
	assert.InDelta(t, 0.1, float64(c.failRate), 0)
	assert.Equal(t, time.Minute, c.restartEvery)

	e, _, _ = testEnv(nil)
	for args, want := range map[string]string{
		"-n 0":                 "-n must be at least 1",
		"-port 65535 -n 2":     "out of the port range",
		"-ports 80,x":          `"x" is not a port`,
		"-node-duration -1s":   "-node-duration cannot be negative",
		"extra":                "unexpected arguments",
		"-drop-after -3":       "-drop-after cannot be negative",
		"-fail-rate lots":      "not a number",
		"-sampler-duration 1x": "invalid value",
	} {
		_, err := parseFakeArgs(e, strings.Fields(args))
		assert.ErrorContains(t, err, want, args)
	}
}

// The behaviour flags reach the fake's node classes: sampler classes get
// the sampler's duration, steps and previews; the others the node duration;
// loaders the load delay.
func TestBehaviourOptions(t *testing.T) {
	t.Parallel()
	b := behaviour{sampler: 2 * time.Second, steps: 20, previews: 5, node: 10 * time.Millisecond, loadDelay: 3 * time.Second, historyDelay: time.Millisecond}
	o := b.options()
	assert.Equal(t, time.Millisecond, o.HistoryDelay)
	fs := o.Nodes["FakeSampler"]
	assert.Equal(t, 2*time.Second, fs.Duration)
	assert.Equal(t, 20, fs.ProgressSteps)
	assert.Equal(t, 5, fs.Previews)
	assert.Equal(t, 10*time.Millisecond, o.Nodes["EmptyImage"].Duration)
	ck := o.Nodes["CheckpointLoaderSimple"]
	assert.Equal(t, 3*time.Second, ck.LoadDelay)
	assert.Equal(t, 10*time.Millisecond, ck.Duration)
	assert.Equal(t, comfytest.Builtins()["SaveImage"].Inputs, o.Nodes["SaveImage"].Inputs, "the class is otherwise unchanged")

	assert.Empty(t, (&behaviour{}).options().Nodes, "no flags: the built-in classes as they are")
}

func TestOutputName(t *testing.T) {
	t.Parallel()
	for want, ref := range map[string]comfy.FileRef{
		"job-0001_ComfyUI_00001_.png":      {Filename: "ComfyUI_00001_.png", Type: "output"},
		"job-0001_temp_preview.png":        {Filename: "preview.png", Type: "temp"},
		"job-0001_a_b_x.png":               {Filename: "x.png", Subfolder: "a/b/", Type: "output"},
		"job-0001_.._.._etc_passwd":        {Filename: "../../etc/passwd", Type: "output"},
		"job-0001_sub_dir_file_with_slash": {Filename: "dir/file_with_slash", Subfolder: "/sub/"},
	} {
		assert.Equal(t, want, outputName("job-0001", ref))
	}
}

// comfypool help, -h and unknown commands, without running anything.
func TestHelpAndUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, out, errb := testEnv(nil)
	require.Equal(t, exitOK, runMain(ctx, e, []string{"help"}))
	for _, c := range commands() {
		assert.Contains(t, out.String(), c.name)
	}
	assert.Empty(t, errb.String())

	e, out, _ = testEnv(nil)
	require.Equal(t, exitOK, runMain(ctx, e, []string{"run", "-h"}))
	assert.Contains(t, out.String(), "usage: comfypool run")
	assert.Contains(t, out.String(), "-server")
	assert.Contains(t, out.String(), "[$COMFYPOOL_SERVERS]")

	e, out2, _ := testEnv(nil)
	require.Equal(t, exitOK, runMain(ctx, e, []string{"help", "run"}))
	assert.Equal(t, out.String(), out2.String(), "help run is run -h")

	e, out, _ = testEnv(nil)
	require.Equal(t, exitOK, runMain(ctx, e, []string{"fake", "-h"}))
	assert.Contains(t, out.String(), "-fail-rate")

	e, _, errb = testEnv(nil)
	require.Equal(t, exitUsage, runMain(ctx, e, nil))
	assert.Contains(t, errb.String(), "Usage:")

	e, _, errb = testEnv(nil)
	require.Equal(t, exitUsage, runMain(ctx, e, []string{"frobnicate"}))
	assert.Contains(t, errb.String(), `unknown command "frobnicate"`)

	e, _, errb = testEnv(nil)
	require.Equal(t, exitUsage, runMain(ctx, e, []string{"run", "-count", "x"}))
	assert.Contains(t, errb.String(), `invalid value "x" for flag -count`)
	assert.Contains(t, errb.String(), "Run 'comfypool run -h' for usage.")

	e, out, _ = testEnv(nil)
	require.Equal(t, exitOK, runMain(ctx, e, []string{"help", "bench"}))
	assert.Contains(t, out.String(), "usage: comfypool bench")
	assert.Contains(t, out.String(), "[$COMFYPOOL_PG_URL]")
}
