package dag

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"
)

// FileStore is a Store that keeps checkpoints and memoised results as
// JSON files under one directory, so that an execution can be resumed
// after the process restarted. See NewFileStore for the layout and the
// guarantees.
//
// A FileStore is safe for concurrent use by multiple goroutines. Several
// processes may share a directory: CreateExecution is exclusive across
// them, but one execution should be run (written) by one process at a
// time. Nothing enforces that: the FileStore takes no lock across
// processes, so two processes that both call Executor.Resume for the same
// execution both run it, submitting its unfinished nodes' jobs twice and
// overwriting each other's checkpoints. Decide outside the Store which
// process resumes what.
type FileStore struct {
	dir  string
	seed maphash.Seed
	// locks are striped per execution ID: Load holds one for reading,
	// the writes (CreateExecution, UpdateExecution, SaveNode(s), Delete)
	// for writing (a batch takes the execution's next sequence number).
	locks [64]sync.RWMutex
}

var _ BatchStore = (*FileStore)(nil)

// Layout of a FileStore directory.
const (
	fsExecutionsDir = "executions"
	fsMemoDir       = "memo"
	fsNodesDir      = "nodes"
	fsExecutionFile = "execution.json"
	fsTempPattern   = ".tmp-*" // temp files, next to their target
	fsTombPrefix    = ".del-"  // executions being deleted
	fsMaxNameLen    = 200      // longer encoded names are hashed
	fsHashedPrefix  = "~"      // hashed names (never made by percent-encoding)
	fsEncodedPrefix = "_"      // percent-encoded names
	fsFileSuffix    = ".json"  // record files
	fsBatchPrefix   = "batch-" // node record batches: batch-<lo>-<hi>.json
	fsMergeFan      = 8        // batches merged at once (see SaveNodes)
)

// NewFileStore returns a FileStore keeping its files under dir, which it
// creates (mode 0o700, files 0o600) if needed. Opening a directory that a
// FileStore used before sees everything stored there.
//
// Layout:
//
//	dir/executions/<name(id)>/execution.json   the ExecutionRecord
//	dir/executions/<name(id)>/nodes/batch-<lo>-<hi>.json
//	                                           node records: {"nodes": [NodeRecord…]}
//	dir/memo/<hex(sha256(key))>.json           {"key": key, "value": value}
//
// name(s) is "_" followed by s with every byte outside [a-z0-9_-]
// percent-encoded in lower-case hex ("Run/1" → "_%52un%2f1"): reversible,
// and safe on Linux, macOS and Windows file systems (no separators, no
// "." or "..", no control characters, no reserved device names, no two
// IDs differing only in case mapping to the same name on a
// case-insensitive file system). A name that would be longer than 200
// bytes is "~" followed by the hex SHA-256 of s instead; the records hold
// the IDs, so nothing needs to decode a name.
//
// Node records are written in batches (SaveNodes; SaveNode writes a batch
// of one), so that a group of records costs one file and one fsync, not
// one each. Each batch has the next sequence number of its execution, lo
// = hi in its name (16 hex digits each); a node's record is the one in
// the batch with the highest number that holds it. So that an execution
// does not pile up files, whenever its fsMergeFan (8) newest batches each
// cover as many numbers, they are merged into one covering all of theirs
// (lo of the first, hi of the last), which keeps the latest record of
// each node, and then removed: an execution has at most 7 batches per
// power of 8 of its writes, and a record is rewritten about log8(writes)
// times. A merged batch is written before the batches it replaces are
// removed; a batch left over by a crash in between is covered by the
// merged one and ignored (removed by the next write). Node files of the
// layout before batches (nodes/<name(node)>.json) are read, as older
// than any batch.
//
// Every write is crash-safe: the record goes to a temporary file in the
// target's directory (".tmp-…", ignored when reading), which is synced
// and renamed over the target, and the directory is synced; a write that
// returned nil survives a crash, and a crash leaves either the old or the
// new record. CreateExecution makes the execution's directory and then
// links its execution.json into place, which fails if one exists, so it
// is exclusive even between processes; a directory without
// execution.json (a crash during CreateExecution) counts as no execution
// and is reused. Delete renames the directory away (".del-…") before
// removing it, so a crash never leaves half an execution behind.
//
// A record file that does not decode, or holds another ID than its name
// says, makes Load (or Memo) fail with an error naming the file: nothing
// is dropped silently.
func NewFileStore(dir string) (*FileStore, error) {
	if dir == "" {
		return nil, errors.New("dag: file store: empty directory name")
	}
	for _, d := range []string{dir, filepath.Join(dir, fsExecutionsDir), filepath.Join(dir, fsMemoDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("dag: file store: %w", err)
		}
	}
	s := &FileStore{dir: dir, seed: maphash.MakeSeed()}
	// Finish deletes a crash interrupted; best effort (another process
	// may be removing the same directory).
	if entries, err := os.ReadDir(filepath.Join(dir, fsExecutionsDir)); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), fsTombPrefix) {
				_ = os.RemoveAll(filepath.Join(dir, fsExecutionsDir, e.Name()))
			}
		}
	}
	return s, nil
}

// Dir returns the directory the store keeps its files in.
func (s *FileStore) Dir() string { return s.dir }

func (s *FileStore) lock(id string) *sync.RWMutex {
	return &s.locks[maphash.String(s.seed, id)%uint64(len(s.locks))]
}

func (s *FileStore) execDir(id string) string {
	return filepath.Join(s.dir, fsExecutionsDir, fsName(id))
}

// CreateExecution writes rec as a new execution; ErrExists if rec.ID is
// taken (by this or another process).
func (s *FileStore) CreateExecution(ctx context.Context, rec *ExecutionRecord) error {
	if err := storeCheckExecution(ctx, rec); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("dag: file store: encode execution %q: %w", rec.ID, err)
	}
	l := s.lock(rec.ID)
	l.Lock()
	defer l.Unlock()

	ed := s.execDir(rec.ID)
	target := filepath.Join(ed, fsExecutionFile)
	if _, err := os.Lstat(target); err == nil {
		return fmt.Errorf("%w: %q", ErrExists, rec.ID)
	}
	if err := os.Mkdir(ed, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("dag: file store: create execution %q: %w", rec.ID, err)
	}
	if err := os.Mkdir(filepath.Join(ed, fsNodesDir), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("dag: file store: create execution %q: %w", rec.ID, err)
	}
	if err := fsSyncDir(filepath.Dir(ed)); err != nil {
		return fmt.Errorf("dag: file store: create execution %q: %w", rec.ID, err)
	}
	if err := fsCreateExclusive(ed, fsExecutionFile, data); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %q", ErrExists, rec.ID)
		}
		return fmt.Errorf("dag: file store: create execution %q: %w", rec.ID, err)
	}
	return nil
}

// UpdateExecution replaces the execution's record; ErrNotFound if there
// is none.
func (s *FileStore) UpdateExecution(ctx context.Context, rec *ExecutionRecord) error {
	if err := storeCheckExecution(ctx, rec); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("dag: file store: encode execution %q: %w", rec.ID, err)
	}
	l := s.lock(rec.ID)
	l.Lock()
	defer l.Unlock()

	ed := s.execDir(rec.ID)
	if err := s.mustExist(ed, rec.ID); err != nil {
		return err
	}
	if err := fsWriteAtomic(ed, fsExecutionFile, data); err != nil {
		if fsIsNotExist(err) {
			return storeNotFound(rec.ID)
		}
		return fmt.Errorf("dag: file store: update execution %q: %w", rec.ID, err)
	}
	return nil
}

// SaveNode writes the record of node rec.Node of execution id, replacing
// any earlier one; ErrNotFound if the execution has no record. It is
// SaveNodes with one record.
func (s *FileStore) SaveNode(ctx context.Context, id string, rec *NodeRecord) error {
	if err := storeCheckNode(ctx, id, rec); err != nil {
		return err
	}
	return s.SaveNodes(ctx, id, []*NodeRecord{rec})
}

// SaveNodes writes the records of execution id's nodes in recs, replacing
// earlier ones, as one batch file (one fsync); ErrNotFound if the
// execution has no record. It either saves them all or none. Merging older
// batches (see NewFileStore) happens after the batch is durable; a merge
// that fails is left for the next write and does not fail this one.
func (s *FileStore) SaveNodes(ctx context.Context, id string, recs []*NodeRecord) error {
	for _, rec := range recs {
		if err := storeCheckNode(ctx, id, rec); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := fsEncodeBatch(recs)
	if err != nil {
		return fmt.Errorf("dag: file store: encode nodes of execution %q: %w", id, err)
	}
	l := s.lock(id)
	l.Lock()
	defer l.Unlock()

	ed := s.execDir(id)
	if err := s.mustExist(ed, id); err != nil || len(recs) == 0 {
		return err
	}
	nd := filepath.Join(ed, fsNodesDir)
	batches, covered, _, err := fsListNodes(nd)
	if err != nil {
		if fsIsNotExist(err) {
			return storeNotFound(id)
		}
		return fmt.Errorf("dag: file store: save nodes of execution %q: %w", id, err)
	}
	for _, b := range covered {
		_ = os.Remove(filepath.Join(nd, b.name())) // a merge's leftover; ignored until gone
	}
	seq := uint64(1)
	if len(batches) > 0 {
		seq = batches[len(batches)-1].hi + 1
	}
	b := fsBatch{lo: seq, hi: seq}
	if err := fsWriteAtomic(nd, b.name(), data); err != nil {
		if fsIsNotExist(err) {
			return storeNotFound(id)
		}
		return fmt.Errorf("dag: file store: save nodes of execution %q: %w", id, err)
	}
	_ = fsMerge(nd, append(batches, b)) // best effort: see the doc comment
	return nil
}

// fsBatchFile is the content of a batch file.
type fsBatchFile struct {
	Nodes []*NodeRecord `json:"nodes"`
}

// fsEncodeBatch encodes recs as a batch file, as json.Marshal of an
// fsBatchFile would, but copies each record's Outputs as they are (they
// were checked to be JSON) rather than validating and compacting them
// again: a batch can hold every output of an execution.
func fsEncodeBatch(recs []*NodeRecord) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"nodes":[`)
	for k, r := range recs {
		if k > 0 {
			buf.WriteByte(',')
		}
		c := *r
		c.Outputs = nil
		data, err := json.Marshal(&c)
		if err != nil {
			return nil, err
		}
		if len(r.Outputs) == 0 {
			buf.Write(data)
			continue
		}
		buf.Write(data[:len(data)-1]) // without its closing brace
		buf.WriteString(`,"outputs":`)
		buf.Write(r.Outputs)
		buf.WriteByte('}')
	}
	buf.WriteString("]}")
	return buf.Bytes(), nil
}

// fsBatch is a batch file, covering the sequence numbers lo to hi.
type fsBatch struct {
	lo, hi uint64
}

func (b fsBatch) name() string {
	return fmt.Sprintf("%s%016x-%016x%s", fsBatchPrefix, b.lo, b.hi, fsFileSuffix)
}

// parseFsBatch parses a batch file's name.
func parseFsBatch(name string) (fsBatch, bool) {
	var b fsBatch
	rest, ok := strings.CutPrefix(name, fsBatchPrefix)
	if !ok {
		return b, false
	}
	rest, ok = strings.CutSuffix(rest, fsFileSuffix)
	if !ok || len(rest) != 33 || rest[16] != '-' {
		return b, false
	}
	lo, err1 := strconv.ParseUint(rest[:16], 16, 64)
	hi, err2 := strconv.ParseUint(rest[17:], 16, 64)
	if err1 != nil || err2 != nil || lo == 0 || hi < lo {
		return b, false
	}
	return fsBatch{lo: lo, hi: hi}, true
}

// fsListNodes lists the node files of nodes directory nd: the batches in
// the order they apply (ascending hi), the batches a wider one covers
// (left over by a crash during a merge, to be ignored), and the files of
// the layout before batches, by name. Temp files and strays are skipped.
// Two batches that overlap without one covering the other (which merges
// never make) are an error.
func fsListNodes(nd string) (batches, covered []fsBatch, legacy []string, err error) {
	entries, err := os.ReadDir(nd)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, fsFileSuffix) {
			continue // temp files and strays
		}
		if b, ok := parseFsBatch(name); ok {
			batches = append(batches, b)
			continue
		}
		if strings.HasPrefix(name, fsEncodedPrefix) || strings.HasPrefix(name, fsHashedPrefix) {
			legacy = append(legacy, name)
		}
	}
	// By hi, then widest first, so that a batch comes after (or, for the
	// same hi, before) those it covers.
	slices.SortFunc(batches, func(a, b fsBatch) int {
		return cmp.Or(cmp.Compare(a.hi, b.hi), cmp.Compare(a.lo, b.lo))
	})
	kept := batches[:0:0]
	for _, b := range batches {
		for len(kept) > 0 && kept[len(kept)-1].lo >= b.lo {
			covered = append(covered, kept[len(kept)-1])
			kept = kept[:len(kept)-1]
		}
		if len(kept) > 0 && kept[len(kept)-1].hi >= b.lo {
			last := kept[len(kept)-1]
			if last.lo <= b.lo && b.hi <= last.hi {
				covered = append(covered, b)
				continue
			}
			return nil, nil, nil, fmt.Errorf("node files %s and %s overlap", filepath.Join(nd, last.name()), filepath.Join(nd, b.name()))
		}
		kept = append(kept, b)
	}
	return kept, covered, legacy, nil
}

// fsMerge removes covered leftovers and merges the newest batches while
// the last fsMergeFan of them cover as many sequence numbers each.
func fsMerge(nd string, batches []fsBatch) error {
	for {
		n := len(batches)
		if n < fsMergeFan {
			return nil
		}
		group := batches[n-fsMergeFan:]
		width := group[0].hi - group[0].lo
		for _, b := range group[1:] {
			if b.hi-b.lo != width {
				return nil
			}
		}
		merged := fsBatch{lo: group[0].lo, hi: group[len(group)-1].hi}
		byNode := make(map[string]*NodeRecord)
		for _, b := range group {
			recs, err := fsReadBatch(filepath.Join(nd, b.name()))
			if err != nil {
				return err
			}
			for _, r := range recs {
				byNode[r.Node] = r
			}
		}
		recs := slices.SortedFunc(maps.Values(byNode), func(a, b *NodeRecord) int { return strings.Compare(a.Node, b.Node) })
		data, err := fsEncodeBatch(recs)
		if err != nil {
			return err
		}
		if err := fsWriteAtomic(nd, merged.name(), data); err != nil {
			return err
		}
		for _, b := range group {
			if err := os.Remove(filepath.Join(nd, b.name())); err != nil && !fsIsNotExist(err) {
				return err
			}
		}
		batches = append(batches[:n-fsMergeFan], merged)
	}
}

// fsReadBatch reads the records of a batch file; an error names the file.
func fsReadBatch(path string) ([]*NodeRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f fsBatchFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("corrupt node file %s: %w", path, err)
	}
	for _, r := range f.Nodes {
		if r == nil || r.Node == "" {
			return nil, fmt.Errorf("node file %s holds a record without a node", path)
		}
	}
	return f.Nodes, nil
}

// mustExist returns ErrNotFound unless execution directory ed has its
// execution.json.
func (s *FileStore) mustExist(ed, id string) error {
	if _, err := os.Lstat(filepath.Join(ed, fsExecutionFile)); err != nil {
		if fsIsNotExist(err) {
			return storeNotFound(id)
		}
		return fmt.Errorf("dag: file store: execution %q: %w", id, err)
	}
	return nil
}

// Load reads the execution's record and every node record; ErrNotFound if
// there is none. A file that does not decode is an error naming it.
func (s *FileStore) Load(ctx context.Context, id string) (*Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := s.lock(id)
	l.RLock()
	defer l.RUnlock()

	ed := s.execDir(id)
	path := filepath.Join(ed, fsExecutionFile)
	data, err := os.ReadFile(path)
	if err != nil {
		if fsIsNotExist(err) {
			return nil, storeNotFound(id)
		}
		return nil, fmt.Errorf("dag: file store: load execution %q: %w", id, err)
	}
	var rec ExecutionRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("dag: file store: load execution %q: corrupt file %s: %w", id, path, err)
	}
	if rec.ID != id {
		return nil, fmt.Errorf("dag: file store: load execution %q: file %s holds execution %q", id, path, rec.ID)
	}
	nd := filepath.Join(ed, fsNodesDir)
	// Another process writing the execution may merge batches between
	// the listing and the reading: a batch gone missing means listing
	// again.
	for attempt := 0; ; attempt++ {
		nodes, err := fsLoadNodes(nd)
		if err != nil && fsIsNotExist(err) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("dag: file store: load execution %q: %w", id, err)
		}
		return &Checkpoint{Execution: &rec, Nodes: nodes}, nil
	}
}

// fsLoadNodes reads the node records of nodes directory nd.
func fsLoadNodes(nd string) (map[string]*NodeRecord, error) {
	nodes := make(map[string]*NodeRecord)
	batches, _, legacy, err := fsListNodes(nd)
	if err != nil {
		if fsIsNotExist(err) {
			return nodes, nil // a directory made by hand, without nodes
		}
		return nil, err
	}
	for _, name := range legacy {
		path := filepath.Join(nd, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		n := new(NodeRecord)
		if err := json.Unmarshal(data, n); err != nil {
			return nil, fmt.Errorf("corrupt node file %s: %w", path, err)
		}
		if n.Node == "" || fsName(n.Node)+fsFileSuffix != name {
			return nil, fmt.Errorf("node file %s holds node %q", path, n.Node)
		}
		nodes[n.Node] = n
	}
	for _, b := range batches {
		recs, err := fsReadBatch(filepath.Join(nd, b.name()))
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			nodes[r.Node] = r
		}
	}
	return nodes, nil
}

// Delete removes the execution's directory; deleting a missing execution
// is not an error.
func (s *FileStore) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := s.lock(id)
	l.Lock()
	defer l.Unlock()

	ed := s.execDir(id)
	tomb := filepath.Join(filepath.Dir(ed), fsTombPrefix+strings.ToLower(rand.Text()))
	if err := os.Rename(ed, tomb); err != nil {
		if fsIsNotExist(err) {
			return nil
		}
		return fmt.Errorf("dag: file store: delete execution %q: %w", id, err)
	}
	if err := fsSyncDir(filepath.Dir(ed)); err != nil {
		return fmt.Errorf("dag: file store: delete execution %q: %w", id, err)
	}
	if err := os.RemoveAll(tomb); err != nil {
		return fmt.Errorf("dag: file store: delete execution %q: remove %s: %w", id, tomb, err)
	}
	return nil
}

// fsMemoFile is the content of a memo file.
type fsMemoFile struct {
	// Key is the memo key, for people reading the file (and a check).
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value,omitempty"`
}

func (s *FileStore) memoPath(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.dir, fsMemoDir, hex.EncodeToString(sum[:])+fsFileSuffix)
}

// Memo returns the value saved under key; ok is false when there is none.
// A memo file that does not decode is an error naming it.
func (s *FileStore) Memo(ctx context.Context, key string) (json.RawMessage, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	path := s.memoPath(key)
	data, err := os.ReadFile(path)
	if err != nil {
		if fsIsNotExist(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("dag: file store: memo: %w", err)
	}
	var m fsMemoFile
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, false, fmt.Errorf("dag: file store: memo: corrupt file %s: %w", path, err)
	}
	if utf8.ValidString(key) && m.Key != key {
		return nil, false, fmt.Errorf("dag: file store: memo: file %s holds key %q", path, m.Key)
	}
	return m.Value, true, nil
}

// SaveMemo saves value under key, replacing any earlier value.
func (s *FileStore) SaveMemo(ctx context.Context, key string, value json.RawMessage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := CheckMemoValue(value); err != nil {
		return err
	}
	data, err := json.Marshal(fsMemoFile{Key: key, Value: value})
	if err != nil {
		return fmt.Errorf("dag: file store: encode memo: %w", err)
	}
	path := s.memoPath(key)
	if err := fsWriteAtomic(filepath.Dir(path), filepath.Base(path), data); err != nil {
		return fmt.Errorf("dag: file store: save memo: %w", err)
	}
	return nil
}

// fsName is the file or directory name of an execution or node ID (see
// NewFileStore).
func fsName(id string) string {
	const hexDigits = "0123456789abcdef"
	var b strings.Builder
	b.WriteString(fsEncodedPrefix)
	for i := 0; i < len(id); i++ {
		c := id[i]
		if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
		if b.Len() > fsMaxNameLen {
			sum := sha256.Sum256([]byte(id))
			return fsHashedPrefix + hex.EncodeToString(sum[:])
		}
	}
	return b.String()
}

// fsWriteTemp writes data to a new synced temp file in dir and returns its
// path.
func fsWriteTemp(dir string, data []byte) (string, error) {
	f, err := os.CreateTemp(dir, fsTempPattern)
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// fsWriteAtomic replaces dir/name with data, crash-safely.
func fsWriteAtomic(dir, name string, data []byte) error {
	tmp, err := fsWriteTemp(dir, data)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return fsSyncDir(dir)
}

// fsCreateExclusive creates dir/name with data, crash-safely, failing
// with an error matching fs.ErrExist if it exists. It links a synced temp
// file into place (link fails on an existing target, even one another
// process just made); on a file system without hard links it falls back
// to a check and a rename, which is exclusive only within the process.
func fsCreateExclusive(dir, name string, data []byte) error {
	tmp, err := fsWriteTemp(dir, data)
	if err != nil {
		return err
	}
	target := filepath.Join(dir, name)
	lerr := os.Link(tmp, target)
	if lerr == nil || errors.Is(lerr, fs.ErrExist) {
		_ = os.Remove(tmp)
		if lerr != nil {
			return lerr
		}
		return fsSyncDir(dir)
	}
	if _, err := os.Lstat(target); err == nil {
		_ = os.Remove(tmp)
		return fs.ErrExist
	}
	if err := os.Rename(tmp, target); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return fsSyncDir(dir)
}

// fsSyncDir syncs a directory, so that renames and creations in it are
// durable. Windows cannot sync a directory (NTFS journals metadata), and
// some file systems refuse to (EINVAL): both are ignored.
func fsSyncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, syscall.EINVAL) {
		return nil
	}
	return err
}

// fsIsNotExist reports whether err means a missing file or directory,
// including a path through a missing directory or a non-directory.
func fsIsNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}
