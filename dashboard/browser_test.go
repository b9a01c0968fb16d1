package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/dashboard"
	"github.com/comfypool/comfypool/pool"
)

// chromium returns the browser to drive: $COMFYPOOL_CHROMIUM, else
// Debian's chromium (or a Chrome) on the PATH. Without one the test is
// skipped, unless CI is set: CI installs it (.ci/run).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("COMFYPOOL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium to drive: install Debian's chromium package (apt-get install chromium) or set COMFYPOOL_CHROMIUM"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestBrowser drives the page in a real headless Chromium, loaded once:
// a running job's progress shows and advances without reloading, then its
// end arrives; a job cancelled by clicking its Cancel button ends as
// cancelled in the pool; metadata is shown as text, never run as markup;
// a page without Authorize has no buttons, and its POSTs get 403.
func TestBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	p, _ := startPool(t, 2, slowSampler(3*time.Second))
	allow := func(*http.Request, dashboard.Action) error { return nil }
	mux := http.NewServeMux()
	mux.Handle("/dash/", http.StripPrefix("/dash", newHandler(t, p, &dashboard.Config{Authorize: allow})))
	mux.Handle("/ro/", http.StripPrefix("/ro", newHandler(t, p, nil)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // CI runs as root
		chromedp.Flag("disable-gpu", true),
	)...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	require.NoError(t, chromedp.Do(bctx), "start the browser") // without a timeout: it would stop the browser
	ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
	defer cancel()
	wait := []chromedp.PollOption{chromedp.WithPollingInterval(50 * time.Millisecond), chromedp.WithPollingTimeout(15 * time.Second)}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/dash/"), chromedp.WaitVisible(chromedp.CSS("#conn.live"))))

	// Jobs enqueued after the page loaded: it learns of them live.
	evil := `<img src=x onerror="window.pwned=1">`
	a, err := p.Enqueue(t.Context(), samplerWF(t, 6, 1), &pool.EnqueueOpts{Metadata: map[string]string{"tenant": evil}})
	require.NoError(t, err)
	b, err := p.Enqueue(t.Context(), samplerWF(t, 6, 2), nil)
	require.NoError(t, err)

	progress := `(() => { const p = document.querySelector('#running tr[data-job=` + js(a) + `] progress'); return p && p.value > %s ? p.value : 0 })()`
	first, err := chromedp.Run(ctx, chromedp.Poll[float64](fmt.Sprintf(progress, "0"), wait...))
	require.NoError(t, err, "the running job's progress shows")
	later, err := chromedp.Run(ctx, chromedp.Poll[float64](fmt.Sprintf(progress, fmt.Sprintf("%v", first)), wait...))
	require.NoError(t, err, "and advances")
	assert.Greater(t, later, first)

	meta, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#running tr[data-job=`+js(a)+`] .kv').textContent`))
	require.NoError(t, err)
	assert.Equal(t, "tenant="+evil, meta, "metadata is text")
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === 1 || document.querySelector('img[src="x"]') !== null`))
	require.NoError(t, err)
	assert.False(t, pwned, "metadata is never markup")
	src, err := chromedp.Run(ctx, chromedp.Poll[string](`(() => { const i = document.querySelector('#running tr[data-job=`+js(a)+`] img.preview'); return i ? i.getAttribute('src') : '' })()`, wait...))
	require.NoError(t, err, "the latest preview shows")
	assert.Contains(t, src, "api/jobs/"+a+"/preview?v=")

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-job=`+js(b)+`] button[data-action="cancel"]`))))
	_, err = p.Wait(ctx, b)
	require.ErrorIs(t, err, pool.ErrCancelled, "the click cancelled the job in the pool")
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#ended tr[data-job=`+js(b)+`] .status')?.textContent === 'cancelled'`, wait...))
	require.NoError(t, err, "the page shows it cancelled")

	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#ended tr[data-job=`+js(a)+`] .status')?.textContent === 'completed'`, wait...))
	require.NoError(t, err, "the job's end arrives without reloading")
	_, err = p.Wait(ctx, a)
	require.NoError(t, err)
	gone, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#running tr[data-job=`+js(a)+`]') === null`))
	require.NoError(t, err)
	assert.True(t, gone, "it left the running jobs")

	// Read-only: no buttons, and a POST from the page itself is refused.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ro/"), chromedp.WaitVisible(chromedp.CSS("#conn.live"))))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#ended tr[data-job=`+js(a)+`] .status')?.textContent === 'completed' && document.querySelectorAll('#backends tbody tr').length === 2`, wait...))
	require.NoError(t, err, "the read-only page shows the pool")
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('button').length`))
	require.NoError(t, err)
	assert.Zero(t, buttons, "no buttons without Authorize")
	mode, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('mode').textContent`))
	require.NoError(t, err)
	assert.Equal(t, "read-only", mode)
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch('api/jobs/'+encodeURIComponent(`+js(b)+`)+'/retry', {method: 'POST'}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, status, "a POST from the page")
	code, _ := post(t, srv.URL+"/ro/api/jobs/"+b+"/retry", nil, nil)
	assert.Equal(t, http.StatusForbidden, code, "a direct POST")
	info, err := p.Job(t.Context(), b)
	require.NoError(t, err)
	assert.Equal(t, pool.StatusCancelled, info.Status, "not retried")
}
