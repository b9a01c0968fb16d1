package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/bench"
)

// readReport reads the JSON report comfypool bench -json wrote.
func readReport(t *testing.T, path string) *report {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var r report
	require.NoError(t, json.Unmarshal(b, &r))
	return &r
}

// rowsOf returns the rows of the scenarios whose name starts with prefix.
func rowsOf(r *report, prefix string) []*row {
	var out []*row
	for _, row := range r.Rows {
		if strings.HasPrefix(row.Scenario, prefix) {
			out = append(out, row)
		}
	}
	return out
}

// comfypool bench -quick, as CI runs it: every scenario runs once at a tiny
// size and completes; the table and the JSON hold each one's figures, the
// machine's description, and no verdict on the targets.
func TestBenchQuick(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := comfypool(t, dir, "bench", "-quick", "-json", "out.json")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "| scenario | metric | value | target | met? |\n|---|---|---|---|---|\n")
	assert.Regexp(t, `(?m)^\d{4}-\d\d-\d\d \d\d:\d\d UTC · go1\.\S+ \S+ · \d+ CPUs.* · load average (\S+ \S+ \S+|unknown) at the start, (\S+ \S+ \S+|unknown) at the end · `, r.stdout)
	assert.Contains(t, r.stdout, "peer: not run (-peer=false)")
	assert.NotContains(t, r.stdout, "| yes |", "targets are not judged in quick mode")
	assert.NotContains(t, r.stdout, "**no**")
	for _, s := range scenarioNames {
		assert.Contains(t, r.stderr, "comfypool bench: "+s+", run 1 of 1\n")
	}

	rep := readReport(t, filepath.Join(dir, "out.json"))
	assert.True(t, rep.Quick)
	assert.Equal(t, 1, rep.RunsEach)
	assert.Empty(t, rep.Errors)
	for _, prefix := range []string{"throughput K=1", "throughput K=2", "dispatch ", "utilisation ", "warm affinity ", "10000 queued jobs", "failover ", "lease memqueue"} {
		rows := rowsOf(rep, prefix)
		require.NotEmpty(t, rows, "rows of %q", prefix)
		for _, row := range rows {
			assert.Len(t, row.Runs, 1, "%s: %s", row.Scenario, row.Metric)
			assert.Nil(t, row.Met, "%s: %s", row.Scenario, row.Metric)
			assert.Contains(t, r.stdout, "| "+row.Scenario+" | "+row.Metric+" | ")
		}
	}
	for _, row := range rowsOf(rep, "failover ") {
		if row.Metric == "comfypool: jobs completed" {
			assert.Equal(t, 1.0, row.Median, "every job completed despite the faults")
			assert.Equal(t, "100%", row.Target)
		}
	}
	assert.Contains(t, rep.Notes["lease pgqueue"], "not run: no -pg URL")
}

// Without node and npm the peer is skipped, saying why, and the rest runs.
func TestBenchPeerSkipped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a bound on a hang, not a wait
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "bench", "-quick", "-peer", "-scenarios", "throughput")
	cmd.Dir = t.TempDir()
	cmd.Env = append(cleanEnv(), "PATH="+t.TempDir()) // an empty folder: no node, no npm
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "stderr:\n%s", &errb)
	assert.Contains(t, out.String(), "peer: skipped (node not found in PATH)")
	assert.Contains(t, out.String(), "| throughput K=1 | comfypool | ")
	assert.NotContains(t, out.String(), "| peer |")
}

// Bad flags are usage errors (exit status 2), before anything runs.
func TestBenchBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "-runs", "0"}, "-runs must be at least 1"},
		{[]string{"bench", "-scenarios", "throughput,nope"}, `unknown scenario "nope"`},
		{[]string{"bench", "extra"}, "unexpected arguments"},
	} {
		r := comfypool(t, t.TempDir(), tc.args...)
		assert.Equal(t, 2, r.code, tc.args)
		assert.Contains(t, r.stderr, tc.want, tc.args)
		assert.Empty(t, r.stdout, tc.args)
	}
	r := comfypool(t, t.TempDir(), "bench", "-h")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "usage: comfypool bench")
}

// The lease scenario on the durable adapters, when the test has a
// PostgreSQL or a Redis ($COMFYPOOL_PG_URL, $COMFYPOOL_REDIS_URL; CI sets
// both): each is measured in a scratch schema or key prefix that is gone
// afterwards.
func TestBenchQuickDurable(t *testing.T) {
	t.Parallel()
	pgURL, redisURL := os.Getenv("COMFYPOOL_PG_URL"), os.Getenv("COMFYPOOL_REDIS_URL")
	if pgURL == "" && redisURL == "" {
		t.Skip("set COMFYPOOL_PG_URL and/or COMFYPOOL_REDIS_URL to run the lease scenario on the durable adapters")
	}
	args := []string{"bench", "-quick", "-scenarios", "lease", "-json", "out.json"}
	if pgURL != "" {
		args = append(args, "-pg", pgURL)
	}
	if redisURL != "" {
		args = append(args, "-redis", redisURL)
	}
	dir := t.TempDir()
	r := comfypool(t, dir, args...)
	require.Equal(t, 0, r.code, r.stderr)
	rep := readReport(t, filepath.Join(dir, "out.json"))
	scratch := regexp.MustCompile(`comfypool_bench_[0-9a-f]{12}`)
	ctx := t.Context()
	if pgURL != "" {
		rows := rowsOf(rep, "lease pgqueue")
		require.NotEmpty(t, rows)
		assert.Contains(t, metrics(rows), "lease+complete, 4 lessee(s)")
		schema := scratch.FindString(rep.Notes["lease pgqueue"])
		require.NotEmpty(t, schema, rep.Notes["lease pgqueue"])
		conn, err := pgx.Connect(ctx, pgURL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", schema).Scan(&n))
		assert.Zero(t, n, "the scratch schema %s was dropped", schema)
	}
	if redisURL != "" {
		rows := rowsOf(rep, "lease redisqueue")
		require.NotEmpty(t, rows)
		assert.Contains(t, metrics(rows), "pickup p99 (woken by Ready)")
		prefix := scratch.FindString(rep.Notes["lease redisqueue"])
		require.NotEmpty(t, prefix, rep.Notes["lease redisqueue"])
		opt, err := redis.ParseURL(redisURL)
		require.NoError(t, err)
		c := redis.NewClient(opt)
		defer c.Close()
		keys, _, err := c.Scan(ctx, 0, "{"+prefix+"}:*", 1000).Result()
		require.NoError(t, err)
		assert.Empty(t, keys, "the keys under %s were deleted", prefix)
	}
}

func metrics(rows []*row) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.Metric)
	}
	return out
}

// The peer: @saintno/comfyui-sdk installed with npm and driven by Node.js
// against the bench's servers. It needs node, npm and the registry, so it
// runs with COMFYPOOL_BENCH_PEER=1 only.
func TestBenchPeer(t *testing.T) {
	if os.Getenv("COMFYPOOL_BENCH_PEER") == "" {
		t.Skip("set COMFYPOOL_BENCH_PEER=1 to install the peer with npm and drive it")
	}
	ctx := t.Context()
	p, err := installPeer(ctx)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(p.dir, "node_modules", "@saintno", "comfyui-sdk", "package.json"))
	require.NoError(t, err)
	assert.Regexp(t, `^@saintno/comfyui-sdk \d+\.\d+\.\d+ ComfyPool`, p.Name())

	// Every job completes, one prompt each, on the pool's servers.
	r, err := bench.Throughput(ctx, &bench.ThroughputConfig{Backends: 2, Jobs: 12, Peer: p})
	require.NoError(t, err)
	require.NoError(t, r.PeerErr)
	assert.Equal(t, 12, r.Peer.Completed)
	assert.Zero(t, r.Peer.Failed)
	assert.Equal(t, 12, r.Peer.Prompts)
	assert.Positive(t, r.Peer.Elapsed)
	assert.Positive(t, r.Peer.CPU)

	// Jobs whose prompts fail are reported as failed, not retried.
	f, err := bench.Failover(ctx, &bench.FailoverConfig{Backends: 3, Jobs: 8, NodeTime: 5 * time.Millisecond, Faulty: 1, Share: 0.5, Peer: p})
	require.NoError(t, err)
	require.NoError(t, f.PeerErr)
	assert.Equal(t, 8, f.Peer.Completed+f.Peer.Failed)
	assert.Positive(t, f.Peer.Failed)
	assert.Equal(t, 8, f.Peer.Prompts, "one prompt per job: no retry")
	assert.NotEmpty(t, f.Peer.Errors)

	p.close()
	_, err = os.Stat(p.dir)
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary folder is removed")
}

// The report: medians, targets judged on them (not in quick mode), the
// spread of the runs, failed scenarios.
func TestReport(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 2.0, median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, median([]float64{4, 1, 2, 3}))

	rep := newReport(&benchConfig{runs: 3})
	for _, v := range []float64{0.95, 0.80, 0.91} {
		rep.add("s", "ratio", unitRatio, v, atLeast(0.9, "≥ 0.90"))
		rep.add("s", "latency", unitMS, v/1000, below(0.0009, "< 0.9 ms"))
		rep.add("s", "count", unitCount, v, nil)
	}
	rep.note("s", "what it did")
	rep.fail("t", assert.AnError)
	rep.finish()
	var out bytes.Buffer
	rep.markdown(&out)
	assert.Contains(t, out.String(), "| s | ratio | 0.910 (0.800–0.950) | ≥ 0.90 | yes |\n")
	assert.Contains(t, out.String(), "| s | latency | 0.91 ms (0.80–0.95) | < 0.9 ms | **no** |\n")
	assert.Contains(t, out.String(), "| s | count | 1 (1–1) |  |  |\n")
	assert.Contains(t, out.String(), "| t | **failed** | "+assert.AnError.Error()+" | | **no** |\n")
	assert.Contains(t, out.String(), "- s: what it did\n")

	quick := newReport(&benchConfig{runs: 1, quick: true})
	quick.add("s", "ratio", unitRatio, 0.5, atLeast(0.9, "≥ 0.90"))
	quick.finish()
	out.Reset()
	quick.markdown(&out)
	assert.Contains(t, out.String(), "| s | ratio | 0.500 | ≥ 0.90 | — |\n")
}

// -quick runs once and leaves the peer out unless asked; -scenarios picks
// and orders them.
func TestParseBenchArgs(t *testing.T) {
	t.Parallel()
	e := &env{getenv: func(string) string { return "" }}
	c, err := parseBenchArgs(e, []string{"-quick"})
	require.NoError(t, err)
	assert.Equal(t, 1, c.runs)
	assert.False(t, c.peer)
	assert.Equal(t, scenarioNames, c.scenarios)

	c, err = parseBenchArgs(e, []string{"-quick", "-peer", "-runs", "2", "-scenarios", "lease,throughput,lease"})
	require.NoError(t, err)
	assert.Equal(t, 2, c.runs)
	assert.True(t, c.peer)
	assert.Equal(t, []string{"throughput", "lease"}, c.scenarios)

	c, err = parseBenchArgs(e, nil)
	require.NoError(t, err)
	assert.Equal(t, 3, c.runs)
	assert.True(t, c.peer)

	env := &env{getenv: func(k string) string {
		return map[string]string{"COMFYPOOL_PG_URL": "postgres://x", "COMFYPOOL_REDIS_URL": "redis://y"}[k]
	}}
	c, err = parseBenchArgs(env, []string{"-redis", "redis://z"})
	require.NoError(t, err)
	assert.Equal(t, "postgres://x", c.pgURL)
	assert.Equal(t, "redis://z", c.redisURL, "the command line wins")
	assert.True(t, slices.Contains(scenarioNames, "lease"))
}
