package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/leakcheck"
	"github.com/comfypool/comfypool/internal/syncbuf"
)

// binary is the comfypool command built for the tests, in TestMain.
var binary string

// TestMain builds the command once (with the race detector when the tests
// have it), runs the tests and fails on a goroutine left behind.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "comfypool-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "comfypool")
	args := []string{"build", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "go build:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	leakcheck.Main(m, "comfypool/cmd/comfypool", "comfypool/pool", "comfytest", "mpb")
}

// An API-format workflow making one solid-colour image: EmptyImage ->
// SaveImage. Overrides of 1.width, 1.height and 1.color show in its PNG.
const imageWorkflow = `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 24, "batch_size": 1, "color": 255}},
  "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "cli"}}
}`

// result is how a comfypool process ended.
type result struct {
	stdout, stderr string
	code           int
}

// comfypool runs the command to its end with args, in dir, and returns
// what it printed and its exit status.
func comfypool(t *testing.T, dir string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a bound on a hang, not a wait
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("comfypool %v: %v", args, err)
	}
	require.NoError(t, ctx.Err(), "comfypool %v did not end; stdout:\n%s\nstderr:\n%s", args, r.stdout, r.stderr)
	t.Logf("comfypool %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// cleanEnv is the test's environment without COMFYPOOL_ variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COMFYPOOL_") {
			env = append(env, kv)
		}
	}
	return env
}

// fakeProcess is a running comfypool fake.
type fakeProcess struct {
	urls   []string
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	done   chan error
}

// startFake starts comfypool fake with args on free ports (-port 0) and
// returns once it printed the URLs of its n servers. The test's cleanup
// interrupts it, and checks that it stopped cleanly.
func startFake(t *testing.T, n int, args ...string) *fakeProcess {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"fake", "-n", strconv.Itoa(n), "-port", "0"}, args...)...)
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	f := &fakeProcess{cmd: cmd, stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = f.stderr
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	for len(f.urls) < n && lines.Scan() {
		f.urls = append(f.urls, lines.Text())
	}
	go func() { // owned: the cleanup waits for it
		_, _ = io.Copy(io.Discard, stdout)
		f.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-f.done:
			assert.NoError(t, err, "comfypool fake exits 0 on SIGINT; stderr:\n%s", f.stderr)
			assert.Contains(t, f.stderr.String(), "stopping")
		case <-time.After(time.Minute): // a bound on a hang, not a wait
			_ = cmd.Process.Kill()
			<-f.done
			t.Errorf("comfypool fake did not stop on SIGINT; stderr:\n%s", f.stderr)
		}
	})
	require.Len(t, f.urls, n, "comfypool fake printed its URLs; stderr:\n%s", f.stderr)
	for _, u := range f.urls {
		require.Regexp(t, `^http://127\.0\.0\.1:\d+$`, u)
	}
	return f
}

// writeFile writes content into dir/name and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// summaryRe matches run's summary line.
var summaryRe = regexp.MustCompile(`(?m)^summary: (\d+) jobs, (\d+) completed, (\d+) failed, (\d+) retries, (\d+) files saved in (.+), wall time (\S+)$`)

// runSummary is run's summary line, parsed.
type runSummary struct{ jobs, completed, failed, retries, files int }

func parseSummary(t *testing.T, stdout string) runSummary {
	t.Helper()
	m := summaryRe.FindStringSubmatch(stdout)
	require.NotNil(t, m, "a summary line in:\n%s", stdout)
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	return runSummary{n(1), n(2), n(3), n(4), n(5)}
}

// backendCounts returns run's per-backend summary line of name: the jobs
// it completed.
func backendCompleted(t *testing.T, stdout, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + `\s+(\d+) completed, (\d+) failed attempts$`).FindStringSubmatch(stdout)
	require.NotNil(t, m, "a summary line for %s in:\n%s", name, stdout)
	v, _ := strconv.Atoi(m[1])
	return v
}

// decodePNG decodes the PNG at path.
func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err, path)
	return img
}

// rgbAt is the 0xRRGGBB colour of img at (x, y).
func rgbAt(img image.Image, x, y int) uint32 {
	r, g, b, _ := img.At(x, y).RGBA()
	return (r>>8)<<16 | (g>>8)<<8 | b>>8
}

// comfypool fake in one process and comfypool run against it in another:
// every job completes, spread over both servers, each output saved as a
// PNG named by job, a line per job start and end naming its server, and a
// summary that adds up.
func TestRunAgainstFakeProcess(t *testing.T) {
	t.Parallel()
	fake := startFake(t, 2)
	dir := t.TempDir()
	wf := writeFile(t, dir, "workflow_api.json", imageWorkflow)
	r := comfypool(t, dir, "run", "-server", "gpu-a="+fake.urls[0], "-server", "gpu-b="+fake.urls[1], "-count", "6", "-max-in-flight", "1", "-out", "images", wf)
	require.Equal(t, 0, r.code)
	assert.Equal(t, runSummary{jobs: 6, completed: 6, files: 6}, parseSummary(t, r.stdout))
	assert.Equal(t, 6, backendCompleted(t, r.stdout, "gpu-a")+backendCompleted(t, r.stdout, "gpu-b"))

	for i := 1; i <= 6; i++ {
		name := fmt.Sprintf("job-%04d", i)
		assert.Regexp(t, `(?m)^start `+name+` on gpu-[ab]$`, r.stdout)
		assert.Regexp(t, `(?m)^done  `+name+` on gpu-[ab] in \S+, 1 file\(s\)$`, r.stdout)
		files, err := filepath.Glob(filepath.Join(dir, "images", name+"_cli_*.png"))
		require.NoError(t, err)
		require.Len(t, files, 1, name)
		img := decodePNG(t, files[0])
		assert.Equal(t, image.Rect(0, 0, 32, 24), img.Bounds())
		assert.Equal(t, uint32(0x0000FF), rgbAt(img, 5, 5))
	}
}

// A batch of ten override lines, in both forms, runs ten jobs, each with its
// line's inputs: its image has the line's size and colour.
func TestRunBatch(t *testing.T) {
	t.Parallel()
	fake := startFake(t, 3)
	dir := t.TempDir()
	wf := writeFile(t, dir, "wf.json", imageWorkflow)
	var batch strings.Builder
	for i := range 10 {
		if i%2 == 0 {
			fmt.Fprintf(&batch, "{\"1.width\": %d, \"1.height\": %d, \"1.color\": %d}\n", 16+i, 8+i, 1000*i)
		} else {
			fmt.Fprintf(&batch, "[{\"node\": \"1\", \"input\": \"width\", \"value\": %d}, {\"node\": \"1\", \"input\": \"height\", \"value\": %d}, {\"node\": \"1\", \"input\": \"color\", \"value\": %d}]\n\n", 16+i, 8+i, 1000*i)
		}
	}
	batchFile := writeFile(t, dir, "batch.jsonl", batch.String())
	r := comfypool(t, dir, "run", "-server", strings.Join(fake.urls, ","), "-batch", batchFile, "-out", "out", wf)
	require.Equal(t, 0, r.code)
	assert.Equal(t, runSummary{jobs: 10, completed: 10, files: 10}, parseSummary(t, r.stdout))
	for i := range 10 {
		files, err := filepath.Glob(filepath.Join(dir, "out", fmt.Sprintf("job-%04d_*.png", i+1)))
		require.NoError(t, err)
		require.Len(t, files, 1)
		img := decodePNG(t, files[0])
		assert.Equal(t, image.Rect(0, 0, 16+i, 8+i), img.Bounds(), "line %d's size", i+1)
		assert.Equal(t, uint32(1000*i), rgbAt(img, 0, 0), "line %d's colour", i+1)
	}
}

// Prompts that fail on the servers (out of memory, -fail-rate) are retried
// on another server and the jobs complete; the summary counts the retries.
// When every prompt fails, every job fails: FAIL lines and exit status 1.
func TestRunRetriesAndFailures(t *testing.T) {
	t.Parallel()
	fake := startFake(t, 2, "-fail-rate", "0.5")
	dir := t.TempDir()
	wf := writeFile(t, dir, "wf.json", imageWorkflow)
	batch := writeFile(t, dir, "b.jsonl", "{\"1.color\": 1}\n{\"1.color\": 2}\n{\"1.color\": 3}\n{\"1.color\": 4}\n")
	// Each server fails every other prompt it runs: four jobs cannot fail
	// ten times.
	r := comfypool(t, dir, "run", "-server", strings.Join(fake.urls, ","), "-batch", batch, "-attempts", "10", "-retry-delay", "0", "-cooldown", "0", wf)
	require.Equal(t, 0, r.code)
	s := parseSummary(t, r.stdout)
	assert.Equal(t, 4, s.completed)
	assert.Positive(t, s.retries, "half the prompts failed: some jobs were retried")
	assert.Contains(t, r.stdout, "torch.OutOfMemoryError")

	bad := startFake(t, 1, "-fail-rate", "1")
	r = comfypool(t, dir, "run", "-server", bad.urls[0], "-count", "2", "-attempts", "2", "-retry-delay", "0", "-cooldown", "0", wf)
	require.Equal(t, 1, r.code)
	assert.Equal(t, runSummary{jobs: 2, failed: 2, retries: 2}, parseSummary(t, r.stdout))
	assert.Regexp(t, `(?m)^FAIL  job-0001 on \S+ after 2 attempt\(s\) in \S+: .*OutOfMemoryError`, r.stdout)
}

// Without -server, run starts fake servers in its process and, without a
// workflow, runs its demo workflow on them, a new seed for every job.
func TestRunEmbeddedFakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := comfypool(t, dir, "run", "-fakes", "2", "-count", "4", "-fake-sampler-duration", "20ms", "-fake-steps", "3")
	require.Equal(t, 0, r.code)
	assert.Equal(t, runSummary{jobs: 4, completed: 4, files: 4}, parseSummary(t, r.stdout))
	for i := 1; i <= 4; i++ {
		files, err := filepath.Glob(filepath.Join(dir, "comfypool-out", fmt.Sprintf("job-%04d_*.png", i)))
		require.NoError(t, err)
		require.Len(t, files, 1, "saved into ./comfypool-out by default")
		// The demo's sampler draws its seed as the colour; each job has
		// its own seed (its number), so none was a cached repeat.
		assert.Equal(t, uint32(i), rgbAt(decodePNG(t, files[0]), 0, 0))
	}
	assert.Equal(t, 4, backendCompleted(t, r.stdout, "fake-1")+backendCompleted(t, r.stdout, "fake-2"))
}

// Servers that cannot be reached: run fails as soon as their dials fail,
// long before its -connect-timeout, naming each server's dial error.
func TestRunUnreachable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wf := writeFile(t, dir, "wf.json", imageWorkflow)
	// Nothing listens on ports 1 and 2; the timeout is longer than the test's
	// bound on the process, so a run that waited for it would fail the test.
	r := comfypool(t, dir, "run", "-connect-timeout", "1h", "-server", "gpu-1=http://127.0.0.1:1", "-server", "http://127.0.0.1:2", wf)
	require.Equal(t, 1, r.code)
	assert.Regexp(t, `^comfypool run: no backend reachable after \S+: gpu-1: .*dial tcp 127\.0\.0\.1:1: connect: connection refused; 127\.0\.0\.1:2: .*dial tcp 127\.0\.0\.1:2: connect: connection refused\n$`, r.stderr)
	assert.NotContains(t, r.stdout, "summary")
}

// Bad input is a clear error and exit status 2; nothing runs.
func TestRunBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wf := writeFile(t, dir, "wf.json", imageWorkflow)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing workflow", []string{"run", "-server", "127.0.0.1:1", "nope.json"}, "open nope.json: no such file or directory"},
		{"not JSON", []string{"run", "-server", "127.0.0.1:1", writeFile(t, dir, "bad.json", `{"1": {"class_type": `)}, "invalid workflow"},
		{"UI format", []string{"run", "-server", "127.0.0.1:1", writeFile(t, dir, "ui.json", `{"nodes": [], "links": []}`)}, "invalid workflow"},
		{"missing batch", []string{"run", "-server", "127.0.0.1:1", "-batch", "nope.jsonl", wf}, "open nope.jsonl: no such file or directory"},
		{"bad batch line", []string{"run", "-server", "127.0.0.1:1", "-batch", writeFile(t, dir, "b.jsonl", "{\"1.width\": 8}\n{\"1.width\": }\n"), wf}, "batch " + filepath.Join(dir, "b.jsonl") + ": line 2: not a JSON object"},
		{"override of a missing node", []string{"run", "-server", "127.0.0.1:1", "-batch", writeFile(t, dir, "n.jsonl", "{\"7.seed\": 1}\n"), wf}, `line 1: no node "7" in the workflow`},
		{"bad flag", []string{"run", "-count", "-2", wf}, "-count must be at least 1"},
		{"bad server", []string{"run", "-server", "ftp://h", wf}, "want an http:// or https:// URL"},
	} {
		r := comfypool(t, dir, tc.args...)
		assert.Equal(t, 2, r.code, tc.name)
		assert.Contains(t, r.stderr, tc.want, tc.name)
		assert.Empty(t, r.stdout, tc.name)
	}
	_, err := os.Stat(filepath.Join(dir, "comfypool-out"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing ran")
}

// comfypool fake serves on the ports it is given, and says so when it
// cannot.
func TestFakePorts(t *testing.T) {
	t.Parallel()
	fake := startFake(t, 1)
	port := strings.TrimPrefix(fake.urls[0], "http://127.0.0.1:")
	r := comfypool(t, t.TempDir(), "fake", "-ports", port)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "address already in use")

	r = comfypool(t, t.TempDir(), "help")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "fake")
	r = comfypool(t, t.TempDir(), "fake", "-h")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "usage: comfypool fake")
}

// SIGINT while jobs run: run stops (interrupting its prompts), prints the
// summary of what ended, says it was interrupted and exits 1.
func TestRunInterrupted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a bound on a hang, not a wait
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "run", "-fakes", "1", "-count", "3", "-fake-sampler-duration", "1h", "-fake-steps", "3600")
	cmd.Dir = t.TempDir()
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errb syncbuf.Buffer
	cmd.Stderr = &errb
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	var out strings.Builder
	for lines.Scan() {
		out.WriteString(lines.Text() + "\n")
		if strings.HasPrefix(lines.Text(), "start job-0001") {
			break
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for lines.Scan() {
		out.WriteString(lines.Text() + "\n")
	}
	err = cmd.Wait()
	require.NoError(t, ctx.Err(), "run did not stop on SIGINT; stdout:\n%s\nstderr:\n%s", &out, &errb)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Equal(t, "comfypool run: interrupted\n", errb.String())
	s := parseSummary(t, out.String())
	assert.Equal(t, 0, s.completed)
	assert.Equal(t, 3, s.jobs, "every job enqueued is counted")
	assert.Contains(t, out.String(), "stop  job-0001: interrupted\n")
}

// One server up and one down: run warns about the one it cannot reach,
// with its dial error, and runs every job on the other.
func TestRunWithOneServerDown(t *testing.T) {
	t.Parallel()
	fake := startFake(t, 1)
	dir := t.TempDir()
	wf := writeFile(t, dir, "wf.json", imageWorkflow)
	r := comfypool(t, dir, "run", "-server", "up="+fake.urls[0], "-server", "down=http://127.0.0.1:1", "-count", "3", "-connect-timeout", "1h", wf)
	require.Equal(t, 0, r.code)
	assert.Regexp(t, `(?m)^comfypool run: warning: not connected \(it joins if it comes up\): down: .*dial tcp 127\.0\.0\.1:1: connect: connection refused$`, r.stderr)
	assert.Equal(t, runSummary{jobs: 3, completed: 3, files: 3}, parseSummary(t, r.stdout))
	assert.Equal(t, 3, backendCompleted(t, r.stdout, "up"))
	assert.Equal(t, 0, backendCompleted(t, r.stdout, "down"))
}
