package fleet_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/pool"
)

// snapshot is what a refused call must not change.
type snapshot struct {
	workers  []fleet.WorkerInfo
	backends []string
	job      pool.Status
	attempts int
}

func (b *bundle) snapshot(t *testing.T, jobID string) snapshot {
	t.Helper()
	s := snapshot{workers: b.h.Workers()}
	for i := range s.workers {
		s.workers[i].LastSeen = time.Time{} // a refused call is still a call
		s.workers[i].Online = false
	}
	for _, bs := range b.pool.Backends() {
		s.backends = append(s.backends, bs.Name)
	}
	info, err := b.pool.Job(t.Context(), jobID)
	require.NoError(t, err)
	s.job, s.attempts = info.Status, len(info.Attempts)
	return s
}

// Every refusal gets its status and problem type, and changes nothing:
// no worker added or altered, no backend, no job touched.
func TestRefusals(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) {
		c.MaxBody = 4 << 10
		c.MaxRegisterBody = 8 << 10
		// w1 calls once, then the cases run: it must stay online through
		// them however slow the machine (with the bundle's 300ms it went
		// offline under load, and "register an online id" was accepted).
		c.OfflineAfter = time.Minute
	}})
	reg := b.register(t, "w1", "a")
	rev := b.register(t, "revoked", "a")
	require.NoError(t, b.h.Revoke(t.Context(), "revoked"))
	id, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), nil)
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	require.Equal(t, id, j.ID)

	secret := map[string]string{fleet.SecretHeader: testSecret}
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	big := bytes.Repeat([]byte(" "), 16<<10)
	cases := []struct {
		name    string
		path    string
		headers map[string]string
		body    any
		status  int
		problem string
	}{
		{"register without secret", "/v1/register", nil, registerReq{WorkerID: "x", Fleet: "gpu", Stage: "a"}, 401, fleet.ProblemWrongSecret},
		{"register with a wrong secret", "/v1/register", map[string]string{fleet.SecretHeader: testSecret + "x"}, registerReq{WorkerID: "x", Fleet: "gpu", Stage: "a"}, 401, fleet.ProblemWrongSecret},
		{"register with bad JSON", "/v1/register", secret, []byte(`{"worker_id": "x",`), 400, fleet.ProblemBadRequest},
		{"register with a wrong type", "/v1/register", secret, []byte(`{"worker_id": 7}`), 400, fleet.ProblemBadRequest},
		{"register too large", "/v1/register", secret, append([]byte(`{"worker_id":"x","fleet":"gpu"}`), big...), 413, fleet.ProblemTooLarge},
		{"register a bad id", "/v1/register", secret, registerReq{WorkerID: "../x", Fleet: "gpu", Stage: "a"}, 400, fleet.ProblemBadRequest},
		{"register without fleet", "/v1/register", secret, registerReq{WorkerID: "x"}, 400, fleet.ProblemBadRequest},
		{"register too concurrent", "/v1/register", secret, registerReq{WorkerID: "x", Fleet: "gpu", MaxConcurrency: 1000}, 400, fleet.ProblemBadRequest},
		{"register a revoked id", "/v1/register", secret, registerReq{WorkerID: "revoked", Fleet: "gpu", Stage: "a"}, 403, fleet.ProblemRevoked},
		{"register an online id", "/v1/register", secret, registerReq{WorkerID: "w1", Fleet: "gpu", Stage: "a"}, 409, fleet.ProblemWorkerInUse},
		{"poll without token", "/v1/poll", nil, map[string]any{}, 401, fleet.ProblemUnauthorized},
		{"poll with an unknown token", "/v1/poll", bearer("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), map[string]any{}, 401, fleet.ProblemUnauthorized},
		{"poll with the secret as token", "/v1/poll", bearer(testSecret), map[string]any{}, 401, fleet.ProblemUnauthorized},
		{"poll with a revoked token", "/v1/poll", bearer(rev.Token), map[string]any{}, 401, fleet.ProblemRevoked},
		{"heartbeat with a revoked token", "/v1/heartbeat", bearer(rev.Token), heartbeatReq{}, 401, fleet.ProblemRevoked},
		{"complete with a revoked token", "/v1/complete", bearer(rev.Token), map[string]any{"job_id": id}, 401, fleet.ProblemRevoked},
		{"heartbeat with bad JSON", "/v1/heartbeat", bearer(reg.Token), []byte(`{"jobs": [`), 400, fleet.ProblemBadRequest},
		{"heartbeat too large", "/v1/heartbeat", bearer(reg.Token), append([]byte(`{"jobs":[]}`), big...), 413, fleet.ProblemTooLarge},
		{"complete with bad JSON", "/v1/complete", bearer(reg.Token), []byte(`not json`), 400, fleet.ProblemBadRequest},
		{"complete an unknown job", "/v1/complete", bearer(reg.Token), map[string]any{"job_id": "nope", "result": map[string]any{}}, 404, fleet.ProblemUnknownJob},
		{"complete with a key not issued", "/v1/complete", bearer(reg.Token), map[string]any{"job_id": id, "result": map[string]any{},
			"files": []map[string]any{{"file": map[string]any{"filename": "x.png", "type": "output"}, "key": "outputs/other"}}}, 400, fleet.ProblemBadRequest},
		{"fail with bad JSON", "/v1/fail", bearer(reg.Token), []byte(`{"job_id":`), 400, fleet.ProblemBadRequest},
		{"fail too large", "/v1/fail", bearer(reg.Token), append([]byte(`{"job_id":"x"}`), big...), 413, fleet.ProblemTooLarge},
		{"requeue an unknown job", "/v1/requeue", bearer(reg.Token), map[string]any{"job_id": "nope"}, 404, fleet.ProblemUnknownJob},
		{"upload URLs for an unknown job", "/v1/upload-urls", bearer(reg.Token), map[string]any{"job_id": "nope"}, 404, fleet.ProblemUnknownJob},
		{"deregister with bad JSON", "/v1/deregister", bearer(reg.Token), []byte(`[`), 400, fleet.ProblemBadRequest},
		{"an unknown endpoint", "/v1/nope", bearer(reg.Token), map[string]any{}, 404, fleet.ProblemBadRequest},
		{"an old version", "/v0/poll", bearer(reg.Token), map[string]any{}, 404, fleet.ProblemBadRequest},
	}
	for _, c := range cases {
		before := b.snapshot(t, id)
		a := b.postHeaders(t, c.path, c.headers, c.body)
		assert.Equal(t, c.status, a.status, "%s: %s", c.name, a.body)
		p := a.problem(t)
		assert.Equal(t, c.problem, p.Type, c.name)
		assert.Equal(t, c.status, p.Status, c.name)
		assert.NotEmpty(t, p.Detail, c.name)
		assert.Equal(t, before, b.snapshot(t, id), "%s changed something", c.name)
	}

	// GET on an endpoint: the protocol is POST only.
	resp, err := http.Get(b.url + "/v1/poll")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// The job still runs on w1 and completes.
	require.Equal(t, http.StatusOK, b.completeWith(t, reg.Token, j, []byte("img")).status)
}

// Registration attempts are limited per address: beyond the burst, 429
// with Retry-After, whatever the secret.
func TestRegisterRateLimit(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) { c.RegisterBurst = 3; c.RegisterRate = 0.001 }})
	send := func(secret, id string) answer {
		return b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: secret}, registerReq{WorkerID: id, Fleet: "gpu", Stage: "a"})
	}
	assert.Equal(t, http.StatusUnauthorized, send("wrong-secret-guess-000000", "x1").status)
	assert.Equal(t, http.StatusUnauthorized, send("wrong-secret-guess-000001", "x2").status)
	assert.Equal(t, http.StatusOK, send(testSecret, "w1").status)
	a := send(testSecret, "w2")
	assert.Equal(t, http.StatusTooManyRequests, a.status)
	assert.Equal(t, fleet.ProblemRateLimited, a.problem(t).Type)
	assert.NotEmpty(t, a.header.Get("Retry-After"))
	names := []string{}
	for _, w := range b.h.Workers() {
		names = append(names, w.ID)
	}
	assert.Equal(t, []string{"w1"}, names)
}

// Signed URLs expire: an input URL and an upload URL past their expiry
// are refused by the store's handler (403), and nothing is stored.
func TestExpiredSignedURLs(t *testing.T) {
	t.Parallel()
	b := newBundle(t, &bundleOpts{fleet: func(c *fleet.Config) { c.URLExpiry = time.Minute }})
	reg := b.register(t, "w1", "a")
	_, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{
		Inputs: []pool.InputFile{{Name: "in.png", Data: []byte("input"), Targets: []pool.InputTarget{{Node: "1", Input: "color"}}}},
	})
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	up := decode[uploadsResp](t, b.post(t, "/v1/upload-urls", reg.Token, map[string]any{
		"job_id": j.ID, "files": []map[string]any{{"file": map[string]any{"filename": "o.png", "type": "output"}}},
	}))
	require.Len(t, up.Uploads, 1)
	status, _ := httpDo(t, http.MethodGet, j.Inputs[0].URL, nil)
	require.Equal(t, http.StatusOK, status, "valid before its expiry")

	b.clock.Advance(time.Minute + time.Second)
	status, body := httpDo(t, http.MethodGet, j.Inputs[0].URL, nil)
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, string(body), "expired")
	status, body = httpDo(t, http.MethodPut, up.Uploads[0].URL, []byte("output"))
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, string(body), "expired")
	_, err = b.store.Stat(t.Context(), up.Uploads[0].Key)
	assert.ErrorIs(t, err, files.ErrNotFound, "nothing stored")
	a := b.post(t, "/v1/complete", reg.Token, map[string]any{
		"job_id": j.ID, "result": map[string]any{"prompt_id": j.PromptID, "outputs": map[string]any{"3": outputOf("o.png")}},
		"files": []map[string]any{{"file": up.Uploads[0].File, "key": up.Uploads[0].Key}},
	})
	assert.Equal(t, http.StatusBadRequest, a.status, "an output that was not uploaded")

	// A signed URL altered to another key is refused too.
	u, err := url.Parse(up.Uploads[0].URL)
	require.NoError(t, err)
	u.Path = strings.Replace(u.Path, "o.png", "x.png", 1)
	b.clock.Advance(-time.Minute - time.Second)
	status, _ = httpDo(t, http.MethodPut, u.String(), []byte("output"))
	assert.Equal(t, http.StatusForbidden, status)
}

// No secret, token or signature appears in any log line (the handler's,
// the pool's, the store's, at debug level) or problem document, in
// plain, hex or base64 form, through registrations, refusals, rotations,
// uploads, revocation.
func TestNoSecretsInLogsOrErrors(t *testing.T) {
	t.Parallel()
	b := newBundle(t, nil)
	var secrets []string
	var problems []string
	note := func(a answer) {
		if a.status != http.StatusOK {
			problems = append(problems, string(a.body))
		}
	}
	note(b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: testSecret[:20] + "WRONG"}, registerReq{WorkerID: "w1", Fleet: "gpu", Stage: "a"}))
	secrets = append(secrets, testSecret[:20]+"WRONG", testSecret)
	reg := b.register(t, "w1", "a")
	secrets = append(secrets, reg.Token)
	_, err := b.pool.Enqueue(t.Context(), mustWF(t, wfA), &pool.EnqueueOpts{
		Inputs: []pool.InputFile{{Name: "in.png", Data: []byte("input"), Targets: []pool.InputTarget{{Node: "1", Input: "color"}}}},
	})
	require.NoError(t, err)
	j := b.pollJob(t, reg.Token)
	for _, in := range j.Inputs {
		u, err := url.Parse(in.URL)
		require.NoError(t, err)
		secrets = append(secrets, u.Query().Get("signature"))
	}
	require.NoError(t, b.h.RotateToken("w1"))
	hb := decode[heartbeatResp](t, b.post(t, "/v1/heartbeat", reg.Token, heartbeatReq{Jobs: []jobReport{{ID: j.ID}}}))
	secrets = append(secrets, hb.NewToken)
	note(b.post(t, "/v1/heartbeat", reg.Token+"x", heartbeatReq{}))
	note(b.completeWith(t, hb.NewToken, j, []byte("img")))
	note(b.post(t, "/v1/poll", reg.Token, map[string]any{}))
	const next = "the-next-fleet-secret-0123456789"
	secrets = append(secrets, next)
	require.NoError(t, b.h.RotateSecret(next, 0))
	note(b.postHeaders(t, "/v1/register", map[string]string{fleet.SecretHeader: testSecret}, registerReq{WorkerID: "w2", Fleet: "gpu", Stage: "a"}))
	require.NoError(t, b.h.Revoke(t.Context(), "w1"))
	note(b.post(t, "/v1/poll", hb.NewToken, map[string]any{}))

	logs := b.logs.String()
	require.Contains(t, logs, "worker registered", "the logs were captured")
	require.NotEmpty(t, problems)
	for _, s := range secrets {
		require.NotEmpty(t, s)
		for _, form := range []string{s, hex.EncodeToString([]byte(s)), base64.StdEncoding.EncodeToString([]byte(s)), base64.RawURLEncoding.EncodeToString([]byte(s))} {
			assert.NotContains(t, logs, form)
			for _, p := range problems {
				assert.NotContains(t, p, form)
			}
		}
	}
	assert.NotContains(t, logs, "signature=")
}
