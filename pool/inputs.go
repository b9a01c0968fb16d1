package pool

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/files"
)

// InputFile is a file the job needs on the backend that runs it (an image
// for LoadImage, say). On every attempt the Pool uploads it to that
// attempt's backend (POST /upload/image, type "input") and sets each
// target input to the name the server returned, which differs from Name
// when the server already holds a different file of that name. The uploads
// share the attempt's submit bound (Config.SubmitTimeout, or Timeouts.Start
// when set); a failed upload is a backend fault: the attempt fails and the
// job is retried on another backend.
type InputFile struct {
	// Name is the file name to upload as: a plain name, no path. Required.
	Name string
	// Data is the file's content. The Pool keeps a reference (it does
	// not copy it): do not modify it until the job ended.
	Data []byte
	// Open, used when Data is nil, returns a fresh reader of the content.
	// It is called once per attempt and the reader is closed after the
	// upload. An error from Open fails the job (no retry).
	Open func() (io.ReadCloser, error)
	// Targets are the workflow inputs set to the uploaded file's name,
	// e.g. {Node: "10", Input: "image"} for a LoadImage node. At least one
	// is required.
	Targets []InputTarget
	// With Config.Files set, Enqueue streams the content (Data or Open)
	// into the file store once, and every attempt, in any Pool on the
	// queue with the same store, reads it from there; an Open or store
	// failure then fails Enqueue with an *InputError. Without a store,
	// Data is kept in the job's record, and a job whose content comes
	// from Open runs only in the Pool that enqueued it (the func lives in
	// its process).
	//
	// Source, when set, says the file is already on a backend: an output
	// of an earlier job, say. An attempt that runs on Source.Backend
	// uploads nothing: the targets name the file in place
	// ("sub/name.png [output]", the annotated form LoadImage accepts). An
	// attempt on another backend uploads the content from Data or Open or,
	// when both are nil, streams it from Source.Backend (as WorkflowPool.View). A
	// source that cannot be read (an unknown backend, a failed download)
	// fails the job like a failed Open, with an *InputError.
	Source *FileSource

	stored *files.Ref // the content in Config.Files (set by Enqueue)
}

// FileSource names a file on one of the Pool's backends.
type FileSource struct {
	// Backend is the backend's name.
	Backend string
	// Ref locates the file on it (as in Result.OutputFiles); Type
	// defaults to "output".
	Ref comfy.FileRef
}

// annotated returns the name by which LoadImage-style nodes find the
// file in place: "sub/name.png [output]".
func (s *FileSource) annotated() string {
	name := s.Ref.Filename
	if s.Ref.Subfolder != "" {
		name = s.Ref.Subfolder + "/" + name
	}
	return name + " [" + cmp.Or(s.Ref.Type, "output") + "]"
}

// InputTarget names one input of one workflow node.
type InputTarget struct {
	Node  string
	Input string
}

// InputError is a job's input file that could not be read (its Open
// failed, or its Source could not be downloaded). It is the job's own
// fault: it fails the job without retry and without blocking the
// backend, and it matches comfy.ErrInvalidWorkflow for that reason.
type InputError struct {
	// Name is the InputFile's Name.
	Name string
	// Err is Open's or the download's error.
	Err error
}

// Error implements error.
func (e *InputError) Error() string {
	return fmt.Sprintf("pool: input file %q: %v", e.Name, e.Err)
}

// Unwrap returns Open's error.
func (e *InputError) Unwrap() error { return e.Err }

// Is reports whether target is comfy.ErrInvalidWorkflow (see InputError).
func (e *InputError) Is(target error) bool { return target == comfy.ErrInvalidWorkflow }

func cloneInputs(in []InputFile) []InputFile {
	if in == nil {
		return nil
	}
	out := make([]InputFile, len(in))
	for i, f := range in {
		f.Targets = append([]InputTarget(nil), f.Targets...)
		if f.Source != nil {
			src := *f.Source
			f.Source = &src
		}
		out[i] = f
	}
	return out
}

// validateInputs checks opts.Inputs against the workflow.
func validateInputs(in []InputFile, wf comfy.Workflow) error {
	for i, f := range in {
		switch {
		case f.Name == "" || strings.ContainsAny(f.Name, "/\\\x00"):
			return fmt.Errorf("%w: EnqueueOpts.Inputs[%d].Name %q must be a plain non-empty file name", ErrInvalid, i, f.Name)
		case f.Data == nil && f.Open == nil && f.Source == nil:
			return fmt.Errorf("%w: EnqueueOpts.Inputs[%d] (%s) has neither Data, Open nor Source", ErrInvalid, i, f.Name)
		case f.Source != nil && (f.Source.Backend == "" || f.Source.Ref.Filename == ""):
			return fmt.Errorf("%w: EnqueueOpts.Inputs[%d] (%s): Source needs a Backend and a Ref.Filename", ErrInvalid, i, f.Name)
		case len(f.Targets) == 0:
			return fmt.Errorf("%w: EnqueueOpts.Inputs[%d] (%s) has no Targets", ErrInvalid, i, f.Name)
		}
		for _, t := range f.Targets {
			if _, ok := wf[t.Node]; !ok {
				return fmt.Errorf("%w: EnqueueOpts.Inputs[%d] (%s): no node %q in the workflow", ErrInvalid, i, f.Name, t.Node)
			}
			if t.Input == "" {
				return fmt.Errorf("%w: EnqueueOpts.Inputs[%d] (%s): node %q: empty input name", ErrInvalid, i, f.Name, t.Node)
			}
		}
	}
	return nil
}

// prepareInputs returns the workflow to submit for this attempt on b: the
// job's workflow itself when it has no input files, else a copy whose
// target inputs name the files just uploaded to b. An upload failure is
// returned as is (a backend fault: the job is retried elsewhere).
func (p *WorkflowPool) prepareInputs(ctx context.Context, b *backend, js *jobState) (comfy.Workflow, error) {
	p.mu.Lock()
	wf := js.wf
	p.mu.Unlock()
	if len(js.opts.Inputs) == 0 || wf == nil {
		return wf, nil
	}
	wf = wf.Clone()
	for _, f := range js.opts.Inputs {
		var name string
		if f.Source != nil && f.Source.Backend == b.cfg.Name {
			name = f.Source.annotated() // already there: nothing to move
		} else {
			r, err := p.openInputFile(ctx, f)
			if err != nil {
				return nil, err
			}
			ref, err := b.client.UploadImage(ctx, r, f.Name, nil)
			_ = r.Close()
			if err != nil {
				return nil, fmt.Errorf("pool: upload input %q to %s: %w", f.Name, b.cfg.Name, err)
			}
			name = ref.Filename
			if ref.Subfolder != "" {
				name = ref.Subfolder + "/" + ref.Filename
			}
		}
		for _, t := range f.Targets {
			if err := wf.SetInput(t.Node, t.Input, name); err != nil {
				return nil, err // validated at Enqueue: cannot happen
			}
		}
	}
	return wf, nil
}

// openInputFile returns a reader of f's content: Data, Open, or a download
// from f.Source's backend. A failure is an *InputError.
func (p *WorkflowPool) openInputFile(ctx context.Context, f InputFile) (io.ReadCloser, error) {
	switch {
	case f.stored != nil:
		st := p.cfg.Files
		if st == nil || st.Name() != f.stored.Store {
			return nil, &InputError{Name: f.Name, Err: fmt.Errorf("its content is in file store %q, which this Pool does not have", f.stored.Store)}
		}
		r, err := st.OpenRef(ctx, *f.stored)
		if err != nil {
			return nil, fmt.Errorf("pool: input %q from the file store: %w", f.Name, err) // the store's fault: retried
		}
		return r, nil
	case f.Data != nil:
		return io.NopCloser(bytes.NewReader(f.Data)), nil
	case f.Open != nil:
		r, err := openInput(f)
		if err != nil {
			return nil, &InputError{Name: f.Name, Err: err}
		}
		return r, nil
	}
	ref := f.Source.Ref
	ref.Type = cmp.Or(ref.Type, "output")
	resp, err := p.View(ctx, f.Source.Backend, ref)
	if err != nil {
		return nil, &InputError{Name: f.Name, Err: fmt.Errorf("download from %s: %w", f.Source.Backend, err)}
	}
	return resp.Body, nil
}

// openInput calls f.Open, turning a panic or a nil reader into an error.
func openInput(f InputFile) (r io.ReadCloser, err error) {
	defer func() {
		if v := recover(); v != nil {
			r, err = nil, fmt.Errorf("Open panicked: %v", v)
		}
	}()
	r, err = f.Open()
	if err == nil && r == nil {
		err = errors.New("Open returned a nil reader")
	}
	return r, err
}

// submit uploads the job's input files to b (see prepareInputs) and submits
// the resulting workflow to b. When the submit fails in a way that leaves
// the server maybe holding the prompt (no answer), it cancels the prompt
// by id before returning, so that it does not run beside the job's retry.
func (p *WorkflowPool) submit(ctx context.Context, b *backend, js *jobState, opts *comfy.RunOptions) (*comfy.Prompt, error) {
	wf, err := p.prepareInputs(ctx, b, js)
	if err != nil {
		return nil, err
	}
	prompt, err := b.client.Submit(ctx, wf, opts)
	if err != nil && mayHaveLanded(err) {
		// The server may have queued the prompt without our knowing: make
		// sure it does not run beside the job's next attempt.
		cctx, cancel := bgCtx()
		defer cancel()
		if cerr := b.client.CancelPrompt(cctx, opts.PromptID); cerr != nil {
			p.log.Warn("cancel of an unanswered prompt failed", "backend", b.cfg.Name, "job_id", js.id, "prompt_id", opts.PromptID, "error", cerr)
		}
	}
	return prompt, err
}

// mayHaveLanded reports whether the server may hold the prompt of a Submit
// that failed: its POST /prompt was sent, or may have been, and no answer
// refused it (a 2xx answer that could not be read counts as accepted).
func mayHaveLanded(err error) bool {
	switch {
	case errors.Is(err, comfy.ErrNotConnected), errors.Is(err, comfy.ErrClosed), errors.Is(err, comfy.ErrInvalidWorkflow):
		return false // nothing was sent, or nothing can be
	}
	return comfy.StatusCode(err) == 0
}

// inputsPrefix names the inputs in Config.Files.
const inputsPrefix = "inputs/"

// storeInput streams f's content (Data or Open) into Config.Files and
// returns its reference. A failure is an *InputError.
func (p *WorkflowPool) storeInput(ctx context.Context, f InputFile) (*files.Ref, error) {
	r, err := p.openInputFile(ctx, f)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	ref, err := p.cfg.Files.PutContentAddressed(ctx, inputsPrefix, r, nil)
	if err != nil {
		return nil, &InputError{Name: f.Name, Err: fmt.Errorf("store it: %w", err)}
	}
	return &ref, nil
}
