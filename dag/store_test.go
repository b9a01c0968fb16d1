package dag_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/dag/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.RunStoreTests(t, func(t *testing.T) dag.Store { return dag.NewMemoryStore() })
}

func TestMemoryStoreLeases(t *testing.T) {
	t.Parallel()
	storetest.RunLeaseTests(t, func(t *testing.T) storetest.LeaseFixture {
		s := dag.NewMemoryStore()
		clock := storetest.NewClock(time.Date(2026, 11, 24, 1, 2, 3, 4, time.UTC))
		s.SetClock(clock.Now)
		return storetest.LeaseFixture{Store: s, Advance: clock.Advance}
	})
}

func TestFileStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.RunStoreTests(t, func(t *testing.T) dag.Store {
		s, err := dag.NewFileStore(t.TempDir())
		require.NoError(t, err)
		return s
	})
}

// bothStores runs f against a MemoryStore and a FileStore.
func bothStores(t *testing.T, f func(t *testing.T, s dag.Store)) {
	t.Helper()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, dag.NewMemoryStore())
	})
	t.Run("file", func(t *testing.T) {
		t.Parallel()
		f(t, newFileStore(t, t.TempDir()))
	})
}

func newFileStore(t *testing.T, dir string) *dag.FileStore {
	t.Helper()
	s, err := dag.NewFileStore(dir)
	require.NoError(t, err)
	return s
}

func sampleExecution(id string) *dag.ExecutionRecord {
	now := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	return &dag.ExecutionRecord{
		ID:      id,
		Status:  dag.StatusRunning,
		Graph:   json.RawMessage(`{"nodes":[],"edges":[]}`),
		Inputs:  json.RawMessage(`{"n":{"int":1}}`),
		Created: now,
		Updated: now,
	}
}

func sampleNode(name string) *dag.NodeRecord {
	return &dag.NodeRecord{Node: name, State: dag.NodeCompleted, Runs: 1, Outputs: json.RawMessage(`{"x":"y"}`)}
}

func TestStoresCancelledContext(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s dag.Store) {
		require.NoError(t, s.CreateExecution(t.Context(), sampleExecution("e")))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, s.CreateExecution(ctx, sampleExecution("f")), context.Canceled)
		require.ErrorIs(t, s.UpdateExecution(ctx, sampleExecution("e")), context.Canceled)
		require.ErrorIs(t, s.SaveNode(ctx, "e", sampleNode("a")), context.Canceled)
		_, err := s.Load(ctx, "e")
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, s.Delete(ctx, "e"), context.Canceled)
		_, _, err = s.Memo(ctx, "k")
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, s.SaveMemo(ctx, "k", nil), context.Canceled)

		cp, err := s.Load(t.Context(), "e")
		require.NoError(t, err, "the execution survived the cancelled Delete")
		assert.Empty(t, cp.Nodes)
	})
}

func TestStoresNilMemoValue(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s dag.Store) {
		require.NoError(t, s.SaveMemo(t.Context(), "k", nil))
		v, ok, err := s.Memo(t.Context(), "k")
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, v)
	})
}

func TestFileStoreReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	s := newFileStore(t, dir)
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e1")))
	require.NoError(t, s.SaveNode(ctx, "e1", sampleNode("a")))
	require.NoError(t, s.SaveNode(ctx, "e1", sampleNode("B/c")))
	up := sampleExecution("e1")
	up.Status = dag.StatusCompleted
	require.NoError(t, s.UpdateExecution(ctx, up))
	require.NoError(t, s.SaveMemo(ctx, "memo-key", json.RawMessage(`{"v":1}`)))
	assert.Equal(t, dir, s.Dir())

	s2 := newFileStore(t, dir)
	cp, err := s2.Load(ctx, "e1")
	require.NoError(t, err)
	assert.Equal(t, dag.StatusCompleted, cp.Execution.Status)
	assert.Equal(t, "e1", cp.Execution.ID)
	assert.JSONEq(t, `{"n":{"int":1}}`, string(cp.Execution.Inputs))
	require.Len(t, cp.Nodes, 2)
	assert.Equal(t, "B/c", cp.Nodes["B/c"].Node)
	v, ok, err := s2.Memo(ctx, "memo-key")
	require.NoError(t, err)
	require.True(t, ok)
	assert.JSONEq(t, `{"v":1}`, string(v))
	require.ErrorIs(t, s2.CreateExecution(ctx, sampleExecution("e1")), dag.ErrExists)
}

// execDirs returns the names in dir/executions.
func execDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "executions"))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func onlyDir(t *testing.T, dir string) string {
	t.Helper()
	names := execDirs(t, dir)
	require.Len(t, names, 1)
	return filepath.Join(dir, "executions", names[0])
}

func TestFileStoreStraysAndGarbage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	s := newFileStore(t, dir)
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e1")))
	require.NoError(t, s.SaveNode(ctx, "e1", sampleNode("a")))
	ed := onlyDir(t, dir)

	// Leftovers of a crash mid-write, and files someone else put there.
	for _, p := range []string{
		filepath.Join(ed, ".tmp-123"),
		filepath.Join(ed, "nodes", ".tmp-456"),
		filepath.Join(ed, "nodes", "README.txt"),
		filepath.Join(dir, "memo", ".tmp-789"),
		filepath.Join(dir, "executions", ".tmp-000"),
	} {
		require.NoError(t, os.WriteFile(p, []byte("{half a rec"), 0o600))
	}
	require.NoError(t, os.Mkdir(filepath.Join(ed, "nodes", "_dir.json"), 0o700))

	// An execution directory without execution.json (a crash inside
	// CreateExecution), with its nodes directory and a temp file.
	garbage := filepath.Join(dir, "executions", "_e2")
	require.NoError(t, os.MkdirAll(filepath.Join(garbage, "nodes"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(garbage, ".tmp-1"), []byte("{"), 0o600))

	for _, st := range []*dag.FileStore{s, newFileStore(t, dir)} {
		cp, err := st.Load(ctx, "e1")
		require.NoError(t, err)
		require.Len(t, cp.Nodes, 1)
		assert.Contains(t, cp.Nodes, "a")
		_, err = st.Load(ctx, "e2")
		require.ErrorIs(t, err, dag.ErrNotFound)
		require.ErrorIs(t, st.SaveNode(ctx, "e2", sampleNode("a")), dag.ErrNotFound)
		require.ErrorIs(t, st.UpdateExecution(ctx, sampleExecution("e2")), dag.ErrNotFound)
		_, ok, err := st.Memo(ctx, "k")
		require.NoError(t, err)
		assert.False(t, ok)
	}

	// The garbage directory is taken over by a real create.
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e2")))
	require.NoError(t, s.SaveNode(ctx, "e2", sampleNode("x")))
	cp, err := s.Load(ctx, "e2")
	require.NoError(t, err)
	assert.Equal(t, "e2", cp.Execution.ID)
	assert.Len(t, cp.Nodes, 1)

	require.NoError(t, s.Delete(ctx, "e1"))
	_, err = s.Load(ctx, "e1")
	require.ErrorIs(t, err, dag.ErrNotFound)
}

func TestFileStoreCorruptFiles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	setup := func(t *testing.T) (*dag.FileStore, string) {
		dir := t.TempDir()
		s := newFileStore(t, dir)
		require.NoError(t, s.CreateExecution(ctx, sampleExecution("e1")))
		require.NoError(t, s.SaveNode(ctx, "e1", sampleNode("a")))
		require.NoError(t, s.SaveNode(ctx, "e1", sampleNode("b")))
		return s, onlyDir(t, dir)
	}

	t.Run("node", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		p := filepath.Join(ed, "nodes", "_b.json")
		require.NoError(t, os.WriteFile(p, []byte(`{"node":"b","state":`), 0o600))
		_, err := s.Load(ctx, "e1")
		require.Error(t, err)
		assert.ErrorContains(t, err, "corrupt node file "+p)
		assert.NotErrorIs(t, err, dag.ErrNotFound)
	})
	t.Run("node holding another node", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		data, err := json.Marshal(sampleNode("a"))
		require.NoError(t, err)
		p := filepath.Join(ed, "nodes", "_c.json") // a node file of the layout before batches
		require.NoError(t, os.WriteFile(p, data, 0o600))
		_, err = s.Load(ctx, "e1")
		require.ErrorContains(t, err, "node file "+p+` holds node "a"`)
	})
	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		p := filepath.Join(ed, "nodes", "batch-0000000000000002-0000000000000002.json")
		require.NoError(t, os.WriteFile(p, []byte(`{"nodes":[{"node":"b","state":`), 0o600))
		_, err := s.Load(ctx, "e1")
		require.ErrorContains(t, err, "corrupt node file "+p)
		assert.NotErrorIs(t, err, dag.ErrNotFound)
	})
	t.Run("batch record without a node", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		p := filepath.Join(ed, "nodes", "batch-0000000000000002-0000000000000002.json")
		require.NoError(t, os.WriteFile(p, []byte(`{"nodes":[{"state":"completed"}]}`), 0o600))
		_, err := s.Load(ctx, "e1")
		require.ErrorContains(t, err, "node file "+p+" holds a record without a node")
	})
	t.Run("overlapping batches", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		for _, name := range []string{"batch-0000000000000002-0000000000000004.json", "batch-0000000000000003-0000000000000005.json"} {
			require.NoError(t, os.WriteFile(filepath.Join(ed, "nodes", name), []byte(`{"nodes":[]}`), 0o600))
		}
		_, err := s.Load(ctx, "e1")
		require.ErrorContains(t, err, "overlap")
	})
	t.Run("execution", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		p := filepath.Join(ed, "execution.json")
		require.NoError(t, os.WriteFile(p, []byte(`garbage`), 0o600))
		_, err := s.Load(ctx, "e1")
		require.ErrorContains(t, err, "corrupt file "+p)
		assert.NotErrorIs(t, err, dag.ErrNotFound)
	})
	t.Run("execution holding another id", func(t *testing.T) {
		t.Parallel()
		s, ed := setup(t)
		rec, err := json.Marshal(sampleExecution("other"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(ed, "execution.json"), rec, 0o600))
		_, err = s.Load(ctx, "e1")
		require.ErrorContains(t, err, `holds execution "other"`)
	})
	t.Run("memo", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		require.NoError(t, s.SaveMemo(ctx, "k", json.RawMessage(`1`)))
		files, err := filepath.Glob(filepath.Join(s.Dir(), "memo", "*.json"))
		require.NoError(t, err)
		require.Len(t, files, 1)
		require.NoError(t, os.WriteFile(files[0], []byte(`{"key":`), 0o600))
		_, _, err = s.Memo(ctx, "k")
		require.ErrorContains(t, err, "corrupt file "+files[0])
	})
}

// nameRE is what an execution directory or node file name (without
// .json) may look like: portable on every file system we support.
var nameRE = regexp.MustCompile(`^(_[a-z0-9_%-]*|~[0-9a-f]{64})$`)

// parseName reverses the percent-encoding of a "_" name.
func parseName(t *testing.T, name string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(name, "_")
	require.True(t, ok, name)
	var b strings.Builder
	for i := 0; i < len(rest); i++ {
		if rest[i] != '%' {
			b.WriteByte(rest[i])
			continue
		}
		require.Less(t, i+2, len(rest), name)
		v, err := hex.DecodeString(rest[i+1 : i+3])
		require.NoError(t, err, name)
		b.WriteByte(v[0])
		i += 2
	}
	return b.String()
}

// encodedLen is the length of the percent-encoded name of id.
func encodedLen(id string) int {
	n := 1
	for i := 0; i < len(id); i++ {
		c := id[i]
		if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-' {
			n++
		} else {
			n += 3
		}
	}
	return n
}

func TestFileStoreNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	s := newFileStore(t, dir)
	ids := []string{
		"run-1", "Run-1", "RUN-1", "a/b", "a\\b", "..", ".", "...", "é", "É", "日本語", "🎉",
		"con", "CON", "aux.json", "a b", "a:b", "a|b", "a\x00b", "a\x1fb", "%41", "A", "_a", "~a",
		strings.Repeat("x", 199), strings.Repeat("x", 200), strings.Repeat("x", 250), strings.Repeat("日", 100),
		strings.Repeat("日", 22), strings.Repeat("日", 23),
	}
	for _, id := range ids {
		require.NoError(t, s.CreateExecution(ctx, sampleExecution(id)), "%q", id)
		require.NoError(t, s.SaveNode(ctx, ids[0], sampleNode(id)), "%q", id)
	}

	check := func(names []string) {
		t.Helper()
		require.Len(t, names, len(ids))
		lower := make(map[string]bool)
		var decoded []string
		hashed := 0
		for _, n := range names {
			n = strings.TrimSuffix(n, ".json")
			assert.Regexp(t, nameRE, n)
			assert.LessOrEqual(t, len(n)+len(".json"), 255)
			assert.False(t, lower[strings.ToLower(n)], "case-insensitive clash: %s", n)
			lower[strings.ToLower(n)] = true
			if strings.HasPrefix(n, "~") {
				hashed++
				continue
			}
			decoded = append(decoded, parseName(t, n))
		}
		// Every short ID's name decodes back to it; the long ones are hashed.
		var short []string
		for _, id := range ids {
			if encodedLen(id) <= 200 {
				short = append(short, id)
			}
		}
		assert.ElementsMatch(t, short, decoded)
		assert.Equal(t, len(ids)-len(short), hashed)
	}
	check(execDirs(t, dir))

	// Node records are in batch files, named by number; the records
	// hold the node IDs.
	entries, err := os.ReadDir(filepath.Join(dir, "executions", "_run-1", "nodes"))
	require.NoError(t, err)
	for _, e := range entries {
		assert.Regexp(t, `^batch-[0-9a-f]{16}-[0-9a-f]{16}\.json$`, e.Name())
	}

	cp, err := s.Load(ctx, ids[0])
	require.NoError(t, err)
	for _, id := range ids {
		require.Contains(t, cp.Nodes, id)
	}
}

func TestFileStorePermissions(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("no POSIX permissions")
	}
	dir := filepath.Join(t.TempDir(), "new", "store")
	s := newFileStore(t, dir)
	ctx := t.Context()
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e")))
	require.NoError(t, s.SaveNode(ctx, "e", sampleNode("a")))
	require.NoError(t, s.SaveMemo(ctx, "k", json.RawMessage(`1`)))
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		assert.Equal(t, want, info.Mode().Perm(), p)
		return nil
	})
	require.NoError(t, err)
}

func TestFileStoreDeleteLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	s := newFileStore(t, dir)
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e")))
	require.NoError(t, s.SaveNode(ctx, "e", sampleNode("a")))
	require.NoError(t, s.Delete(ctx, "e"))
	assert.Empty(t, execDirs(t, dir))

	// A delete a crash interrupted (renamed away, not removed) is finished
	// when the store is opened again.
	tomb := filepath.Join(dir, "executions", ".del-abc")
	require.NoError(t, os.MkdirAll(filepath.Join(tomb, "nodes"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(tomb, "nodes", "_a.json"), []byte(`{}`), 0o600))
	newFileStore(t, dir)
	assert.Empty(t, execDirs(t, dir))
}

// TestFileStoreCreateExclusiveAcrossStores: stores that share a directory
// but no locks (as two processes would) race to create the same
// executions; exactly one wins each, also when the directory is left over
// from a crash.
func TestFileStoreCreateExclusiveAcrossStores(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	const stores, rounds = 4, 50
	var ss []*dag.FileStore
	for range stores {
		ss = append(ss, newFileStore(t, dir))
	}
	for r := range rounds {
		id := fmt.Sprintf("e%d", r)
		if r%2 == 1 {
			// Garbage from a crashed create.
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "executions", "_"+id, "nodes"), 0o700))
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []int
		)
		for i, s := range ss {
			wg.Go(func() {
				rec := sampleExecution(id)
				rec.Inputs = json.RawMessage(fmt.Sprintf(`{"store":{"int":%d}}`, i))
				err := s.CreateExecution(ctx, rec)
				if err == nil {
					mu.Lock()
					winners = append(winners, i)
					mu.Unlock()
					return
				}
				assert.ErrorIs(t, err, dag.ErrExists)
			})
		}
		wg.Wait()
		require.Len(t, winners, 1, "round %d: winners %v", r, winners)
		cp, err := ss[0].Load(ctx, id)
		require.NoError(t, err)
		assert.JSONEq(t, fmt.Sprintf(`{"store":{"int":%d}}`, winners[0]), string(cp.Execution.Inputs))
	}
	// No temp files left behind.
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		require.NoError(t, err)
		assert.False(t, strings.HasPrefix(d.Name(), ".tmp-"), p)
		return nil
	})
	require.NoError(t, err)
}

// TestFileStoreConcurrentMixed runs saves, loads, updates, deletes and
// re-creates of a few executions at once (for the race detector, and to
// see that every error is one of the documented ones).
func TestFileStoreConcurrentMixed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newFileStore(t, t.TempDir())
	ids := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				id := ids[(w+i)%len(ids)]
				var err error
				switch (w + i) % 5 {
				case 0:
					err = s.CreateExecution(ctx, sampleExecution(id))
					if err != nil {
						assert.ErrorIs(t, err, dag.ErrExists)
					}
				case 1, 2:
					err = s.SaveNode(ctx, id, sampleNode(fmt.Sprint("n", i%4)))
					if err != nil {
						assert.ErrorIs(t, err, dag.ErrNotFound)
					}
				case 3:
					_, err = s.Load(ctx, id)
					if err != nil {
						assert.ErrorIs(t, err, dag.ErrNotFound)
					}
				case 4:
					if i%3 == 0 {
						assert.NoError(t, s.Delete(ctx, id))
					} else if err = s.UpdateExecution(ctx, sampleExecution(id)); err != nil {
						assert.ErrorIs(t, err, dag.ErrNotFound)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		cp, err := s.Load(ctx, id)
		if err != nil {
			require.ErrorIs(t, err, dag.ErrNotFound)
			continue
		}
		for name, n := range cp.Nodes {
			assert.Equal(t, name, n.Node)
		}
	}
}

func TestNewFileStoreErrors(t *testing.T) {
	t.Parallel()
	_, err := dag.NewFileStore("")
	require.Error(t, err)
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err = dag.NewFileStore(f)
	require.Error(t, err)
	_, err = dag.NewFileStore(filepath.Join(f, "sub"))
	require.Error(t, err)
}

func TestStoresConcurrentMemo(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s dag.Store) {
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				key := fmt.Sprint("k", i%3)
				assert.NoError(t, s.SaveMemo(t.Context(), key, json.RawMessage(fmt.Sprint(i))))
				_, ok, err := s.Memo(t.Context(), key)
				assert.NoError(t, err)
				assert.True(t, ok)
			})
		}
		wg.Wait()
		for k := range 3 {
			v, ok, err := s.Memo(t.Context(), fmt.Sprint("k", k))
			require.NoError(t, err)
			require.True(t, ok)
			var n int
			require.NoError(t, json.Unmarshal(v, &n))
			assert.Equal(t, k, n%3, "k%d holds a value saved under another key", k)
		}
	})
}

// BenchmarkStoreSaveNode measures one checkpoint write (what every node
// transition costs): the FileStore writes a temp file, fsyncs it, renames
// it and fsyncs the directory.
func BenchmarkStoreSaveNode(b *testing.B) {
	outputs := json.RawMessage(`{"images":[{"file":{"name":"ComfyUI_00001_.png","backend":"gpu-0","ref":{"filename":"ComfyUI_00001_.png","subfolder":"","type":"output"}}}]}`)
	for _, tc := range []struct {
		name  string
		store func(b *testing.B) dag.Store
	}{
		{"memory", func(*testing.B) dag.Store { return dag.NewMemoryStore() }},
		{"file", func(b *testing.B) dag.Store {
			s, err := dag.NewFileStore(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := tc.store(b)
			ctx := context.Background()
			if err := s.CreateExecution(ctx, &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Graph: json.RawMessage(`{}`)}); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				i++
				if err := s.SaveNode(ctx, "e", &dag.NodeRecord{Node: "n" + strconv.Itoa(i%100), State: dag.NodeCompleted, Outputs: outputs}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// nodeFiles lists the files in an execution's nodes directory.
func nodeFiles(t *testing.T, ed string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(ed, "nodes"))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// Batches are merged as they pile up: the files of an execution stay few
// and the latest record of each node wins.
func TestFileStoreBatchesMerge(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	s := newFileStore(t, dir)
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e1")))
	ed := onlyDir(t, dir)
	const writes = 300
	for k := 1; k <= writes; k++ {
		recs := []*dag.NodeRecord{{Node: "n" + strconv.Itoa(k%10), State: dag.NodeRunning, Runs: k}}
		if k%3 == 0 {
			recs = append(recs, &dag.NodeRecord{Node: "every3", State: dag.NodeQueued, Runs: k})
		}
		require.NoError(t, s.SaveNodes(ctx, "e1", recs))
		// At most 7 batches per power of 8: 300 writes, 3 levels.
		require.LessOrEqual(t, len(nodeFiles(t, ed)), 3*7+1, "after %d writes: %v", k, nodeFiles(t, ed))
	}
	check := func(s *dag.FileStore) {
		t.Helper()
		cp, err := s.Load(ctx, "e1")
		require.NoError(t, err)
		require.Len(t, cp.Nodes, 11)
		for j := range 10 {
			assert.Equal(t, writes-(writes-j)%10, cp.Nodes["n"+strconv.Itoa(j)].Runs, j)
		}
		assert.Equal(t, writes, cp.Nodes["every3"].Runs)
	}
	check(s)
	check(newFileStore(t, dir))

	// A crash between writing a merged batch and removing the batches it
	// replaces leaves them: they are ignored, then removed.
	stale, err := json.Marshal(map[string]any{"nodes": []*dag.NodeRecord{{Node: "n1", State: dag.NodePending, Runs: -1}}})
	require.NoError(t, err)
	leftover := filepath.Join(ed, "nodes", "batch-0000000000000001-0000000000000001.json")
	require.NoError(t, os.WriteFile(leftover, stale, 0o600))
	check(s)
	require.NoError(t, s.SaveNodes(ctx, "e1", []*dag.NodeRecord{{Node: "n0", State: dag.NodeCompleted, Runs: writes}}))
	assert.NoFileExists(t, leftover)
	check(s)
}

// Node files of the layout before batches are read, as older than any
// batch.
func TestFileStoreReadsNodeFilesBeforeBatches(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	s := newFileStore(t, dir)
	require.NoError(t, s.CreateExecution(ctx, sampleExecution("e1")))
	ed := onlyDir(t, dir)
	for _, n := range []*dag.NodeRecord{{Node: "x", State: dag.NodeRunning, Runs: 1}, {Node: "Y/1", State: dag.NodeCompleted, Runs: 1}} {
		data, err := json.Marshal(n)
		require.NoError(t, err)
		name := "_x.json"
		if n.Node == "Y/1" {
			name = "_%59%2f1.json"
		}
		require.NoError(t, os.WriteFile(filepath.Join(ed, "nodes", name), data, 0o600))
	}
	require.NoError(t, s.SaveNode(ctx, "e1", &dag.NodeRecord{Node: "x", State: dag.NodeCompleted, Runs: 2}))
	cp, err := s.Load(ctx, "e1")
	require.NoError(t, err)
	require.Len(t, cp.Nodes, 2)
	assert.Equal(t, 2, cp.Nodes["x"].Runs)
	assert.Equal(t, dag.NodeCompleted, cp.Nodes["Y/1"].State)
}
