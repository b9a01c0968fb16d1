package dag

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
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
	// locks are striped per execution ID: SaveNode and Load hold one for
	// reading (saves of different nodes, and of the same node, run in
	// parallel: each is an atomic rename), CreateExecution,
	// UpdateExecution and Delete for writing.
	locks [64]sync.RWMutex
}

var _ Store = (*FileStore)(nil)

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
)

// NewFileStore returns a FileStore keeping its files under dir, which it
// creates (mode 0o700, files 0o600) if needed. Opening a directory that a
// FileStore used before sees everything stored there.
//
// Layout:
//
//	dir/executions/<name(id)>/execution.json       the ExecutionRecord
//	dir/executions/<name(id)>/nodes/<name(node)>.json  one NodeRecord each
//	dir/memo/<hex(sha256(key))>.json               {"key": key, "value": value}
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
// any earlier one; ErrNotFound if the execution has no record.
func (s *FileStore) SaveNode(ctx context.Context, id string, rec *NodeRecord) error {
	if err := storeCheckNode(ctx, id, rec); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("dag: file store: encode node %q of execution %q: %w", rec.Node, id, err)
	}
	l := s.lock(id)
	l.RLock()
	defer l.RUnlock()

	ed := s.execDir(id)
	if err := s.mustExist(ed, id); err != nil {
		return err
	}
	if err := fsWriteAtomic(filepath.Join(ed, fsNodesDir), fsName(rec.Node)+fsFileSuffix, data); err != nil {
		if fsIsNotExist(err) {
			return storeNotFound(id)
		}
		return fmt.Errorf("dag: file store: save node %q of execution %q: %w", rec.Node, id, err)
	}
	return nil
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
	cp := &Checkpoint{Execution: &rec, Nodes: make(map[string]*NodeRecord)}

	nd := filepath.Join(ed, fsNodesDir)
	entries, err := os.ReadDir(nd)
	if err != nil && !fsIsNotExist(err) {
		return nil, fmt.Errorf("dag: file store: load execution %q: %w", id, err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, fsFileSuffix) || e.IsDir() {
			continue // temp files and strays
		}
		path := filepath.Join(nd, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("dag: file store: load execution %q: %w", id, err)
		}
		n := new(NodeRecord)
		if err := json.Unmarshal(data, n); err != nil {
			return nil, fmt.Errorf("dag: file store: load execution %q: corrupt node file %s: %w", id, path, err)
		}
		if n.Node == "" || fsName(n.Node)+fsFileSuffix != name {
			return nil, fmt.Errorf("dag: file store: load execution %q: node file %s holds node %q", id, path, n.Node)
		}
		cp.Nodes[n.Node] = n
	}
	return cp, nil
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
	if err := storeCheckRaw("memo value", value); err != nil {
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
