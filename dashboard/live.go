package dashboard

import (
	"sync"
	"time"

	"github.com/comfypool/comfypool/pool"
)

// maxLiveJobs bounds the jobs whose latest progress the cache keeps.
const maxLiveJobs = 4096

// previewTypes are the image types served as previews; anything else
// (an SVG, say, which could carry script) is not kept.
var previewTypes = map[string]bool{
	"image/jpeg": true, "image/png": true, "image/webp": true, "image/gif": true,
}

// liveCache keeps what only events tell about running jobs: the latest
// progress and preview image of each. Every event stream feeds it (the
// same event from several streams is applied once: entries are versioned
// by the event's time), and the snapshot and the preview endpoint read it.
// It is bounded: maxLiveJobs jobs, of which maxPreviews with an image of
// at most maxBytes. It is safe for concurrent use.
type liveCache struct {
	maxPreviews, maxBytes int

	mu       sync.Mutex
	jobs     map[string]*liveJob
	previews int // jobs with an image
}

type liveJob struct {
	progress   *pool.ProgressEvent
	progressAt time.Time
	image      []byte // the pool's slice, never modified
	mime       string
	imageAt    time.Time // the preview's version
	touched    time.Time
}

func newLiveCache(maxPreviews, maxBytes int) *liveCache {
	return &liveCache{maxPreviews: maxPreviews, maxBytes: maxBytes, jobs: map[string]*liveJob{}}
}

// note applies one event of the pool.
func (c *liveCache) note(ev pool.Event) {
	if ev.JobID == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch ev.Kind {
	case pool.EventJobProgress:
		if ev.Progress == nil {
			return
		}
		j := c.entry(ev.JobID, ev.Time)
		if ev.Time.Before(j.progressAt) {
			return
		}
		p := *ev.Progress
		j.progress, j.progressAt, j.touched = &p, ev.Time, ev.Time
	case pool.EventJobPreview:
		if !c.keeps(ev.Preview) {
			return
		}
		j := c.entry(ev.JobID, ev.Time)
		if ev.Time.Before(j.imageAt) || ev.Time.Equal(j.imageAt) && j.image != nil {
			return
		}
		if j.image == nil {
			c.previews++
		}
		j.image, j.mime, j.imageAt, j.touched = ev.Preview.Image, ev.Preview.MIMEType, ev.Time, ev.Time
		for c.previews > c.maxPreviews {
			c.dropOldestPreview()
		}
	case pool.EventJobStarted, pool.EventJobQueued, pool.EventJobRetrying,
		pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled:
		// A new attempt starts afresh; an ended job shows its record. A
		// stream that lags behind another replays older events: they
		// remove nothing newer than themselves.
		if j := c.jobs[ev.JobID]; j != nil && !ev.Time.Before(j.progressAt) && !ev.Time.Before(j.imageAt) {
			c.remove(ev.JobID)
		}
	}
}

// keeps reports whether the cache keeps such a preview: of an image type
// it serves and within its size.
func (c *liveCache) keeps(p *pool.PreviewEvent) bool {
	return p != nil && c.maxPreviews > 0 && len(p.Image) <= c.maxBytes && previewTypes[p.MIMEType]
}

// entry returns the job's entry, making room for a new one.
func (c *liveCache) entry(id string, now time.Time) *liveJob {
	if j := c.jobs[id]; j != nil {
		return j
	}
	if len(c.jobs) >= maxLiveJobs {
		var oldest string
		var at time.Time
		for k, j := range c.jobs {
			if oldest == "" || j.touched.Before(at) {
				oldest, at = k, j.touched
			}
		}
		c.remove(oldest)
	}
	j := &liveJob{touched: now}
	c.jobs[id] = j
	return j
}

func (c *liveCache) remove(id string) {
	if j := c.jobs[id]; j != nil {
		if j.image != nil {
			c.previews--
		}
		delete(c.jobs, id)
	}
}

func (c *liveCache) dropOldestPreview() {
	var oldest *liveJob
	for _, j := range c.jobs {
		if j.image != nil && (oldest == nil || j.imageAt.Before(oldest.imageAt)) {
			oldest = j
		}
	}
	if oldest == nil {
		c.previews = 0
		return
	}
	oldest.image, oldest.mime, oldest.imageAt = nil, "", time.Time{}
	c.previews--
}

// progress returns the job's latest progress and its preview's version
// (0 when none).
func (c *liveCache) progress(id string) (*pool.ProgressEvent, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.jobs[id]
	if j == nil {
		return nil, 0
	}
	var version int64
	if j.image != nil {
		version = j.imageAt.UnixNano()
	}
	return j.progress, version
}

// preview returns the job's latest preview image.
func (c *liveCache) preview(id string) (image []byte, mime string, at time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.jobs[id]
	if j == nil || j.image == nil {
		return nil, "", time.Time{}, false
	}
	return j.image, j.mime, j.imageAt, true
}
