package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
)

// Why a job stops before its prompt ends.
const (
	stopNone     = iota
	stopShutdown // Run's ctx ended: give the job back
	stopDrop     // the pool no longer runs it here (gone, or forgotten): no report
)

// runJob is a job the agent runs.
type runJob struct {
	s       *session
	w       jobWire
	ctx     context.Context
	stopCtx context.CancelFunc

	mu      sync.Mutex
	why     int
	cancel  chan struct{} // closed when the control plane asks for an interrupt
	started bool          // execution_start relayed (or pending)
	pending []eventWire   // executed messages and the start, in order
	prog    *eventWire    // latest progress
	preview *eventWire    // latest preview
}

// start runs a job given by a poll, holding the slot the poll took.
func (s *session) start(w jobWire) {
	ctx, cancel := context.WithCancel(s.fatalCtx)
	j := &runJob{s: s, w: w, ctx: ctx, stopCtx: cancel, cancel: make(chan struct{})}
	s.mu.Lock()
	s.jobs[w.ID] = j
	s.mu.Unlock()
	s.a.log.Info("job started", "job_id", w.ID, "prompt_id", w.PromptID, "attempt", w.Attempt)
	s.wg.Go(func() {
		defer func() {
			cancel()
			s.mu.Lock()
			delete(s.jobs, w.ID)
			s.mu.Unlock()
			<-s.slots
		}()
		j.run()
	})
}

// stop ends the job early for why (the first reason wins).
func (j *runJob) stop(why int) {
	j.mu.Lock()
	if j.why == stopNone {
		j.why = why
	}
	j.mu.Unlock()
	j.stopCtx()
}

func (j *runJob) reason() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.why
}

// cancelPrompt asks for the prompt's interrupt (the job was cancelled or
// timed out); the job then reports how the prompt ended.
func (j *runJob) cancelPrompt() {
	j.mu.Lock()
	defer j.mu.Unlock()
	select {
	case <-j.cancel:
	default:
		close(j.cancel)
	}
}

// onMessage keeps what the next heartbeat relays: the start and outputs
// in order, the latest progress and preview.
func (j *runJob) onMessage(m comfy.Message) {
	j.mu.Lock()
	switch m := m.(type) {
	case *comfy.ExecutionStart, *comfy.Executing, *comfy.ExecutionCached:
		if j.started {
			j.mu.Unlock()
			return
		}
		j.started = true
		j.pending = append(j.pending, eventWire{Type: eventStarted})
	case *comfy.Progress:
		j.prog = &eventWire{Type: eventProgress, Node: m.Node, Value: m.Value, Max: m.Max}
	case *comfy.Preview:
		j.preview = &eventWire{Type: eventPreview, MIMEType: m.MIMEType, Image: m.Image}
	case *comfy.Executed:
		if m.Output == nil {
			j.mu.Unlock()
			return
		}
		j.pending = append(j.pending, eventWire{Type: eventExecuted, Node: m.Node, Output: m.Output})
	default:
		j.mu.Unlock()
		return
	}
	j.mu.Unlock()
	select {
	case j.s.kick <- struct{}{}:
	default:
	}
}

// takeEvents returns the events to relay and forgets them; a preview
// larger than what is left of budget (half the control plane's body
// limit, shared by the jobs) is dropped.
func (j *runJob) takeEvents(budget *int64) []eventWire {
	j.mu.Lock()
	defer j.mu.Unlock()
	ev := j.pending
	j.pending = nil
	if j.prog != nil {
		ev = append(ev, *j.prog)
		j.prog = nil
	}
	if j.preview != nil {
		if size := int64(len(j.preview.Image))*4/3 + 256; size <= *budget {
			*budget -= size
			ev = append(ev, *j.preview)
		}
		j.preview = nil
	}
	return ev
}

// run runs the job and reports its end.
func (j *runJob) run() {
	s := j.s
	res, err := j.execute()
	// A prompt that finished is reported even when the agent is shutting
	// down (its result is worth more than a give-back): neither the check
	// below nor the report's context is cut by a shutdown stop, only by
	// each request's bound.
	if (err != nil || j.reason() == stopDrop || s.fatalCtx.Err() != nil) && j.stopped() {
		return
	}
	ctx := context.WithoutCancel(j.ctx)
	if err == nil {
		err = j.complete(ctx, res)
		if err == nil {
			s.a.log.Info("job completed", "job_id", j.w.ID)
			return
		}
		if j.stopped() {
			return
		}
		if isGone(err) {
			s.a.log.Warn("completion refused: the pool no longer runs this attempt", "job_id", j.w.ID, "error", err)
			return
		}
		var pe *ProblemError
		if errors.As(err, &pe) {
			s.a.log.Warn("completion refused", "job_id", j.w.ID, "error", err)
		}
		// The outputs could not be stored: fail, the pool retries elsewhere.
	}
	if ferr := s.call(ctx, pathFail, failRequest{JobID: j.w.ID, Error: encodeError(err)}, nil); ferr != nil && !isGone(ferr) {
		s.a.log.Warn("reporting a failure failed", "job_id", j.w.ID, "error", ferr)
	}
	s.a.log.Info("job failed", "job_id", j.w.ID, "error", err)
}

// stopped handles a job stopped early: given back on shutdown, dropped
// otherwise; it reports whether the job was.
func (j *runJob) stopped() bool {
	s := j.s
	switch {
	case s.fatalCtx.Err() != nil:
		return true
	case j.reason() == stopDrop:
		s.a.log.Info("job dropped", "job_id", j.w.ID)
		return true
	case j.reason() == stopShutdown:
		ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), s.a.cfg.ShutdownTimeout)
		defer cancel()
		s.giveBack(ctx, j.w.ID, "the agent is shutting down")
		s.a.log.Info("job given back", "job_id", j.w.ID)
		return true
	}
	return false
}

func isGone(err error) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && (pe.Type == ProblemJobGone || pe.Type == ProblemUnknownJob)
}

// execute uploads the inputs, submits the prompt and waits for its end,
// interrupting it when the control plane asks or the job stops.
func (j *runJob) execute() (*comfy.Result, error) {
	s, ctx := j.s, j.ctx
	wf, err := comfy.ParseWorkflow(j.w.Workflow)
	if err != nil {
		return nil, err
	}
	for _, in := range j.w.Inputs {
		name, err := j.uploadInput(ctx, in)
		if err != nil {
			return nil, err
		}
		for _, t := range in.Targets {
			if err := wf.SetInput(t.Node, t.Input, name); err != nil {
				return nil, err
			}
		}
	}
	prompt, err := s.comfy.Submit(ctx, wf, &comfy.RunOptions{PromptID: j.w.PromptID, ExtraData: j.w.ExtraData, OnMessage: j.onMessage})
	if err != nil {
		if mayHaveLanded(err) { // the server may hold it: it must not run beside the retry
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = s.comfy.CancelPrompt(cctx, j.w.PromptID)
			cancel()
		}
		return nil, err
	}
	cancel := j.cancel
	done := ctx.Done()
	for {
		select {
		case <-prompt.Done():
			return prompt.Wait(context.WithoutCancel(ctx))
		case <-cancel:
			cancel = nil
			j.interrupt(prompt)
		case <-done:
			j.interrupt(prompt)
			return nil, ctx.Err()
		}
	}
}

func (j *runJob) interrupt(p *comfy.Prompt) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), 10*time.Second)
	defer cancel()
	if err := p.Interrupt(ctx); err != nil {
		j.s.a.log.Warn("interrupting a prompt failed", "job_id", j.w.ID, "prompt_id", j.w.PromptID, "error", err)
	}
}

// mayHaveLanded reports whether a failed Submit may have left the prompt
// on the server (as the pool decides for a dialled backend).
func mayHaveLanded(err error) bool {
	switch {
	case errors.Is(err, comfy.ErrNotConnected), errors.Is(err, comfy.ErrClosed), errors.Is(err, comfy.ErrInvalidWorkflow):
		return false
	}
	return comfy.StatusCode(err) == 0
}

// uploadInput streams an input from its signed URL to the server and
// returns the name the server gave it.
func (j *runJob) uploadInput(ctx context.Context, in inputWire) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.URL, nil)
	if err != nil {
		return "", fmt.Errorf("fleet: input %q: bad URL", in.Name)
	}
	resp, err := j.s.a.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("fleet: fetch input %q: %w", in.Name, redactURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("fleet: fetch input %q from %s: %s", in.Name, redactURL(in.URL), resp.Status)
	}
	ref, err := j.s.comfy.UploadImage(ctx, resp.Body, in.Name, nil)
	if err != nil {
		return "", err
	}
	if ref.Subfolder != "" {
		return ref.Subfolder + "/" + ref.Filename, nil
	}
	return ref.Filename, nil
}

// complete uploads the outputs through signed URLs and reports the result.
func (j *runJob) complete(ctx context.Context, res *comfy.Result) error {
	s := j.s
	var outs []outputFileWire
	var seen []comfy.FileRef
	for _, f := range res.Files() {
		if !slices.Contains(seen, f) {
			seen = append(seen, f)
			outs = append(outs, outputFileWire{File: f})
		}
	}
	req := completeRequest{JobID: j.w.ID, Result: resultWire{PromptID: res.PromptID, Outputs: res.Outputs, Cached: res.Cached, Recovered: res.Recovered}}
	if len(outs) > 0 {
		var up uploadURLsResponse
		if err := s.call(ctx, pathUploadURLs, uploadURLsRequest{JobID: j.w.ID, Files: outs}, &up); err != nil {
			return err
		}
		for _, u := range up.Uploads {
			if err := j.uploadOutput(ctx, u); err != nil {
				return err
			}
			req.Files = append(req.Files, storedWire{File: u.File, Key: u.Key})
		}
	}
	return s.call(ctx, pathComplete, req, nil)
}

// uploadOutput streams an output from the server to its signed PUT URL.
func (j *runJob) uploadOutput(ctx context.Context, u uploadWire) error {
	view, err := j.s.comfy.View(ctx, u.File, nil)
	if err != nil {
		return err
	}
	defer view.Body.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.URL, view.Body)
	if err != nil {
		return fmt.Errorf("fleet: output %q: bad upload URL", u.File.Filename)
	}
	req.ContentLength = view.ContentLength
	if view.ContentLength < 0 {
		req.ContentLength = 0
		req.TransferEncoding = []string{"chunked"}
	}
	if view.ContentType != "" {
		req.Header.Set("Content-Type", view.ContentType)
	}
	resp, err := j.s.a.http.Do(req)
	if err != nil {
		return fmt.Errorf("fleet: upload output %q: %w", u.File.Filename, redactURLError(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fleet: upload output %q to %s: %s", u.File.Filename, redactURL(u.URL), resp.Status)
	}
	return nil
}
