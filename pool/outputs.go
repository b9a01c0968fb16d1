package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/files"
)

// DefaultMaxDownloadBytes is the default of Config.MaxDownloadBytes.
const DefaultMaxDownloadBytes = 256 << 20

// ErrOutputTooLarge is matched by *OutputTooLargeError.
var ErrOutputTooLarge = errors.New("pool: outputs too large to download")

// OutputTooLargeError fails a job run with EnqueueOpts.DownloadOutputs
// whose output files add up to more than Config.MaxDownloadBytes. The job
// is not retried (its outputs would be as large elsewhere): the error
// matches ErrOutputTooLarge and, for the failover, comfy.ErrInvalidWorkflow.
type OutputTooLargeError struct {
	// File is the file that crossed the limit.
	File comfy.FileRef
	// Limit is Config.MaxDownloadBytes.
	Limit int64
}

// Error implements error.
func (e *OutputTooLargeError) Error() string {
	return fmt.Sprintf("pool: output files exceed MaxDownloadBytes (%d bytes) at %q", e.Limit, e.File.Filename)
}

// Is reports whether target is ErrOutputTooLarge or comfy.ErrInvalidWorkflow.
func (e *OutputTooLargeError) Is(target error) bool {
	return target == ErrOutputTooLarge || target == comfy.ErrInvalidWorkflow
}

// OutputFile is one output file of a completed job.
type OutputFile struct {
	// Backend is the backend that holds the file (Result.Backend).
	Backend string
	// Node is the output node that produced it.
	Node string
	// Ref locates the file on Backend (see WorkflowPool.View).
	Ref comfy.FileRef
	// Data and ContentType hold the file when the job ran with
	// EnqueueOpts.DownloadOutputs; Data is nil otherwise.
	Data        []byte
	ContentType string
	// Stored is the file's copy in Config.Files, when one is configured:
	// Result.Open reads it from there.
	Stored *files.Ref
}

// OutputFiles returns the job's output files, nodes in id order, with the
// backend holding each and, if they were downloaded eagerly, their bytes.
func (r *Result) OutputFiles() []OutputFile {
	if r == nil {
		return nil
	}
	return slices.Clone(r.files)
}

// Open streams one output file of the result: from memory when it was
// downloaded eagerly (EnqueueOpts.DownloadOutputs), else from the backend
// that holds it. The caller closes the reader. A ref that is not one of
// the result's files gives an error matching ErrNotFound.
func (r *Result) Open(ctx context.Context, ref comfy.FileRef) (io.ReadCloser, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil Result", ErrInvalid)
	}
	i := slices.IndexFunc(r.files, func(f OutputFile) bool { return f.Ref == ref })
	if i < 0 {
		return nil, fmt.Errorf("%w: output file %q of job %s", ErrNotFound, ref.Filename, r.JobID)
	}
	if f := r.files[i]; f.Data != nil {
		return io.NopCloser(bytes.NewReader(f.Data)), nil
	}
	if r.pool == nil {
		return nil, fmt.Errorf("%w: Result not produced by a Pool", ErrInvalid)
	}
	if f := r.files[i]; f.Stored != nil {
		st := r.pool.cfg.Files
		if st == nil || st.Name() != f.Stored.Store {
			return nil, fmt.Errorf("%w: output file %q is in file store %q, which this Pool does not have", ErrNotFound, ref.Filename, f.Stored.Store)
		}
		return st.OpenRef(ctx, *f.Stored)
	}
	resp, err := r.pool.View(ctx, r.Backend, ref)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// outputFiles lists cres's files for the Result, with the eagerly
// downloaded bytes when there are any.
func outputFiles(backend string, cres *comfy.Result, got []OutputFile) []OutputFile {
	if cres == nil {
		return nil
	}
	nodes := make([]string, 0, len(cres.Outputs))
	for id := range cres.Outputs {
		nodes = append(nodes, id)
	}
	slices.SortFunc(nodes, comfy.CompareNodeIDs)
	var out []OutputFile
	for _, n := range nodes {
		for _, ref := range cres.Outputs[n].Files() {
			f := OutputFile{Backend: backend, Node: n, Ref: ref}
			if i := slices.IndexFunc(got, func(g OutputFile) bool { return g.Node == n && g.Ref == ref }); i >= 0 {
				f.Data, f.ContentType, f.Stored = got[i].Data, got[i].ContentType, got[i].Stored
			}
			out = append(out, f)
		}
	}
	return out
}

// fetchOutputs downloads the output files of a job run with
// DownloadOutputs from b, before the job completes, and keeps them in the
// job's record. A download error is returned as is (a backend fault: the
// job is retried elsewhere); too many bytes give an *OutputTooLargeError.
func (p *WorkflowPool) fetchOutputs(ctx context.Context, js *jobState, b *backend, cres *comfy.Result) error {
	if cres == nil {
		return nil
	}
	if !js.opts.DownloadOutputs {
		return p.storeOutputs(ctx, js, b, cres)
	}
	limit := p.cfg.MaxDownloadBytes
	left := limit
	var got []OutputFile
	for _, f := range outputFiles(b.cfg.Name, cres, nil) {
		resp, err := b.client.View(ctx, f.Ref, nil)
		if err != nil {
			return fmt.Errorf("pool: download output %q from %s: %w", f.Ref.Filename, b.cfg.Name, err)
		}
		data, err := readAtMost(resp.Body, left)
		_ = resp.Body.Close()
		if errors.Is(err, errTooLarge) {
			return &OutputTooLargeError{File: f.Ref, Limit: limit}
		}
		if err != nil {
			return fmt.Errorf("pool: download output %q from %s: %w", f.Ref.Filename, b.cfg.Name, err)
		}
		left -= int64(len(data))
		f.Data, f.ContentType = data, resp.ContentType
		if st := p.cfg.Files; st != nil {
			ref, err := st.PutContentAddressed(ctx, outputsPrefix, bytes.NewReader(data), &files.PutOptions{ContentType: f.ContentType, Size: int64(len(data))})
			if err != nil {
				return fmt.Errorf("pool: store output %q: %w", f.Ref.Filename, err)
			}
			f.Stored = &ref
		}
		got = append(got, f)
	}
	p.mu.Lock()
	js.downloads = got
	p.mu.Unlock()
	return nil
}

// outputsPrefix names the outputs in Config.Files.
const outputsPrefix = "outputs/"

// storeOutputs streams the output files of a completed prompt from b into
// Config.Files, when one is configured, and keeps their references in the
// job's record (see Config.Files).
func (p *WorkflowPool) storeOutputs(ctx context.Context, js *jobState, b *backend, cres *comfy.Result) error {
	st := p.cfg.Files
	if st == nil {
		return nil
	}
	var got []OutputFile
	for _, f := range outputFiles(b.cfg.Name, cres, nil) {
		resp, err := b.client.View(ctx, f.Ref, nil)
		if err != nil {
			return fmt.Errorf("pool: download output %q from %s: %w", f.Ref.Filename, b.cfg.Name, err)
		}
		ref, err := st.PutContentAddressed(ctx, outputsPrefix, resp.Body, &files.PutOptions{ContentType: resp.ContentType})
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("pool: store output %q from %s: %w", f.Ref.Filename, b.cfg.Name, err)
		}
		f.ContentType, f.Stored = resp.ContentType, &ref
		got = append(got, f)
	}
	p.mu.Lock()
	js.downloads = got
	p.mu.Unlock()
	return nil
}

// errTooLarge is readAtMost's error for content over its limit.
var errTooLarge = errors.New("pool: content over the download limit")

// readAtMost reads r to its end, at most limit bytes (more gives
// errTooLarge); empty content is a non-nil empty slice.
func readAtMost(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	switch {
	case err != nil:
		return nil, err
	case int64(len(data)) > limit:
		return nil, errTooLarge
	case data == nil:
		data = []byte{}
	}
	return data, nil
}
