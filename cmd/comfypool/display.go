package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/comfypool/comfypool/pool"
)

// display shows a run as it goes. Its methods are safe for concurrent use;
// none is called after close.
type display interface {
	// event shows a job event of the Pool (job:started, job:progress,
	// job:retrying) of the job named job. Events are best-effort: the
	// Pool drops some when the display falls behind.
	event(ev pool.Event, job string)
	// ended shows how a job ended.
	ended(o *outcome)
	// close ends the display (bars are completed and drawn a last time).
	close()
}

// lineDisplay prints a line as each job starts, is retried and ends: the
// display when stdout is not a terminal.
type lineDisplay struct {
	mu sync.Mutex
	w  io.Writer
}

func newLineDisplay(w io.Writer) *lineDisplay { return &lineDisplay{w: w} }

func (d *lineDisplay) printf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.w, format, args...)
}

func (d *lineDisplay) event(ev pool.Event, job string) {
	switch ev.Kind {
	case pool.EventJobStarted:
		d.printf("start %s on %s%s\n", job, ev.Backend, attemptNote(ev.Attempt))
	case pool.EventJobRetrying:
		d.printf("retry %s: attempt %d on %s failed: %v; next in %s\n", job, ev.Attempt, ev.Backend, oneLine(ev.Err), ev.RetryAfter.Round(time.Millisecond))
	}
}

func (d *lineDisplay) ended(o *outcome) {
	if o.err == errInterrupted {
		d.printf("stop  %s: interrupted\n", o.job.name)
		return
	}
	if o.err != nil {
		d.printf("FAIL  %s on %s after %d attempt(s) in %s: %v\n", o.job.name, cmp.Or(o.backend, "no backend"), len(o.attempts), o.took.Round(time.Millisecond), oneLine(o.err))
		return
	}
	d.printf("done  %s on %s in %s, %d file(s)\n", o.job.name, o.backend, o.took.Round(time.Millisecond), len(o.files))
}

func (d *lineDisplay) close() {}

func attemptNote(n int) string {
	if n > 1 {
		return fmt.Sprintf(" (attempt %d)", n)
	}
	return ""
}

// oneLine is err's message on one line.
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// barDisplay draws, with mpb, a bar per backend (the progress of the job it
// runs, and how many it ran) and one for the whole run, with retries and
// failures printed above them: the display on a terminal.
type barDisplay struct {
	p     *mpb.Progress
	all   *mpb.Bar
	bars  map[string]*mpb.Bar
	order []string

	mu       sync.Mutex // guards the state below, read by the decorators
	failed   int
	backends map[string]*backendState
}

// backendState is what a backend's bar shows.
type backendState struct {
	job          string // the job whose progress it shows
	value, max   float64
	done, failed int
}

// newBarDisplay starts a display of backends and a run of jobs jobs on w.
// opts are added to the mpb container's (tests render to a buffer).
func newBarDisplay(w io.Writer, backends []string, jobs int, opts ...mpb.ContainerOption) *barDisplay {
	d := &barDisplay{
		p:        mpb.New(append([]mpb.ContainerOption{mpb.WithOutput(w), mpb.WithRefreshRate(100 * time.Millisecond)}, opts...)...),
		bars:     map[string]*mpb.Bar{},
		order:    backends,
		backends: map[string]*backendState{},
	}
	width := len("all jobs")
	for _, b := range backends {
		width = max(width, len(b))
	}
	for _, name := range backends {
		st := &backendState{}
		d.backends[name] = st
		d.bars[name] = d.p.AddBar(0,
			mpb.PrependDecorators(
				decor.Name(name, decor.WC{W: width + 1, C: decor.DindentRight}),
				decor.Any(func(decor.Statistics) string { return d.backendJob(st) }, decor.WC{W: 22, C: decor.DindentRight}),
			),
			mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return d.backendCounts(st) })),
		)
	}
	d.all = d.p.AddBar(int64(jobs),
		mpb.PrependDecorators(
			decor.Name("all jobs", decor.WC{W: width + 1, C: decor.DindentRight}),
			decor.CountersNoUnit("%d/%d", decor.WC{W: 22, C: decor.DindentRight}),
		),
		mpb.AppendDecorators(
			decor.Percentage(decor.WC{W: 5}),
			decor.Any(func(decor.Statistics) string { return d.failures() }),
			decor.Elapsed(decor.ET_STYLE_GO, decor.WC{W: 8}),
		),
	)
	return d
}

func (d *barDisplay) backendJob(st *backendState) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case st.job == "":
		return "idle"
	case st.max > 0:
		return fmt.Sprintf("%s %.0f/%.0f", st.job, st.value, st.max)
	}
	return st.job
}

func (d *barDisplay) backendCounts(st *backendState) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st.failed > 0 {
		return fmt.Sprintf(" %d done, %d failed attempts", st.done, st.failed)
	}
	return fmt.Sprintf(" %d done", st.done)
}

func (d *barDisplay) failures() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failed > 0 {
		return fmt.Sprintf(" %d failed ", d.failed)
	}
	return " "
}

// scaled maps a progress value onto the bar's integer scale.
func scaled(v float64) int64 { return int64(math.Round(v * 100)) }

func (d *barDisplay) event(ev pool.Event, job string) {
	bar := d.bars[ev.Backend]
	d.mu.Lock()
	st := d.backends[ev.Backend]
	if st == nil {
		d.mu.Unlock()
		return
	}
	var value, maxv float64
	switch ev.Kind {
	case pool.EventJobStarted:
		st.job, st.value, st.max = job, 0, 0
	case pool.EventJobProgress:
		if ev.Progress == nil {
			d.mu.Unlock()
			return
		}
		st.job, st.value, st.max = job, ev.Progress.Value, ev.Progress.Max
		value, maxv = st.value, st.max
	case pool.EventJobRetrying:
		st.failed++
	}
	d.mu.Unlock()
	// Bars are updated without d.mu: they call the decorators, which take it.
	switch ev.Kind {
	case pool.EventJobStarted:
		bar.SetTotal(0, false)
		bar.SetCurrent(0)
	case pool.EventJobProgress:
		bar.SetTotal(scaled(maxv), false)
		bar.SetCurrent(scaled(value))
	case pool.EventJobRetrying:
		fmt.Fprintf(d.p, "retry %s: attempt %d on %s failed: %v\n", job, ev.Attempt, ev.Backend, oneLine(ev.Err))
	}
}

func (d *barDisplay) ended(o *outcome) {
	d.mu.Lock()
	if st := d.backends[o.backend]; st != nil {
		if o.err == nil {
			st.done++
		}
		if st.job == o.job.name {
			st.job, st.value, st.max = "", 0, 0
		}
	}
	if o.err != nil {
		d.failed++
		if st := d.backends[o.backend]; st != nil && o.err != errInterrupted {
			st.failed++ // the last attempt, not reported as a retry
		}
	}
	d.mu.Unlock()
	if bar := d.bars[o.backend]; bar != nil {
		bar.SetTotal(0, false)
		bar.SetCurrent(0)
	}
	if o.err != nil && o.err != errInterrupted {
		fmt.Fprintf(d.p, "FAIL %s on %s after %d attempt(s): %v\n", o.job.name, cmp.Or(o.backend, "no backend"), len(o.attempts), oneLine(o.err))
	}
	d.all.Increment()
}

func (d *barDisplay) close() {
	for _, name := range d.order {
		d.bars[name].SetTotal(-1, true)
	}
	if !d.all.Completed() {
		d.all.Abort(false)
	}
	d.p.Wait()
}
