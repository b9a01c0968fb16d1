// The comfypool dashboard. Plain JavaScript, no build step, no library.
// Every piece of data reaches the DOM as text (textContent, text nodes,
// dataset): job metadata and error messages are user data, never markup.
'use strict';

(() => {
  const terminal = new Set(['completed', 'failed', 'cancelled']);
  const cancellable = new Set(['queued', 'unschedulable', 'running', 'retrying']);
  const retryable = new Set(['failed', 'cancelled']);

  const state = {
    actions: new Set(), // the action kinds whose buttons show
    limit: 50,
    overview: null,
    jobs: new Map(), // id -> job, the dashboard's lists
    results: [], // ids of the search results, in order
    resultJobs: new Map(), // id -> job, the search results
    next: '', // the search's next page
    query: null, // the search's parameters
    stopped: false,
    loading: null, // the snapshot being read
  };
  const previews = new Map(); // id -> <img>, kept so that an image is not reloaded
  const fetching = new Set(); // ids whose details are being read

  // h builds an element. props: class, text, dataset, on* listeners, other
  // attributes; children: nodes or strings (as text nodes).
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const shortId = (s) => (s && s.length > 12 ? s.slice(0, 8) + '…' : s || '');
  const time = (s) => (s ? Date.parse(s) : 0);

  function fmtTime(s) {
    if (!s) return '–';
    const d = new Date(s);
    const today = new Date().toDateString() === d.toDateString();
    return today ? d.toLocaleTimeString() : d.toLocaleString();
  }

  function fmtAge(seconds) {
    const s = Math.round(seconds);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  }

  function fmtBytes(n) {
    if (!n) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  function showMessage(text, isError) {
    const m = document.getElementById('message');
    m.textContent = text;
    m.className = isError ? 'message error' : 'message';
    m.hidden = false;
  }

  function setConn(text, cls) {
    const c = document.getElementById('conn');
    c.textContent = text;
    c.className = 'conn ' + (cls || '');
  }

  // --- jobs ---------------------------------------------------------------

  // fromView turns the server's {job, progress, preview} into a job.
  function fromView(v) {
    const j = v.job;
    return {
      id: j.id,
      status: j.status,
      backend: j.backend || '',
      workflow: j.workflow || '',
      metadata: j.metadata || {},
      enqueued_at: j.enqueued_at || '',
      started_at: j.started_at || '',
      finished_at: j.finished_at || '',
      error: j.last_error || j.unschedulable || null,
      attempts: (j.attempts || []).length,
      progress: v.progress || null,
      preview: v.preview || 0,
      updated: 0, // time of the latest event applied
      detailed: true,
    };
  }

  function blank(id) {
    return {
      id, status: '', backend: '', workflow: '', metadata: null, enqueued_at: '', started_at: '',
      finished_at: '', error: null, attempts: 0, progress: null, preview: 0, updated: 0, detailed: false,
    };
  }

  // apply merges one delta of the event stream into a job.
  function apply(j, d) {
    const t = time(d.time);
    if (t < j.updated) return;
    j.updated = t;
    if (d.backend) j.backend = d.backend;
    if (d.status) {
      if (d.status !== j.status) {
        if (terminal.has(d.status)) j.finished_at = d.time;
        if (d.status === 'running') j.started_at = d.time;
        if (d.status === 'queued') j.finished_at = '';
      }
      j.status = d.status;
      j.error = d.error || null;
      if (d.status !== 'running') { j.progress = null; j.preview = 0; }
      if (d.status === 'running' && !d.progress) j.progress = null;
    }
    if (d.progress) j.progress = d.progress;
    if (d.preview) j.preview = d.preview;
  }

  function onDeltas(deltas) {
    for (const d of deltas) {
      let j = state.jobs.get(d.id);
      if (!j) {
        const status = d.status || 'running';
        if ((status === 'queued' || status === 'unschedulable') && count(isWaiting) >= state.limit) {
          // Beyond the list's length: the overview counts it.
        } else {
          j = blank(d.id);
          if (!d.status) { j.status = 'running'; j.started_at = d.time; } // progress of a job not seen starting
          if (d.status === 'queued') j.enqueued_at = d.time;
          state.jobs.set(d.id, j);
        }
      }
      if (j) {
        apply(j, d);
        if (!j.detailed && !terminal.has(j.status)) details(j.id);
      }
      const r = state.resultJobs.get(d.id);
      if (r) apply(r, d);
    }
    trim();
    render();
  }

  // details reads a job's record once (its metadata and workflow, which
  // events do not carry).
  async function details(id) {
    if (fetching.has(id) || fetching.size > 20) return;
    fetching.add(id);
    try {
      const r = await fetch('api/jobs?id=' + encodeURIComponent(id));
      if (!r.ok) return;
      const page = await r.json();
      const j = state.jobs.get(id);
      if (!j || !page.jobs.length) return;
      const f = fromView(page.jobs[0]);
      j.metadata = f.metadata;
      j.workflow = f.workflow;
      j.enqueued_at = f.enqueued_at || j.enqueued_at;
      j.attempts = f.attempts;
      j.detailed = true;
      render();
    } catch (e) {
      // The next snapshot fills it in.
    } finally {
      fetching.delete(id);
    }
  }

  const isRunning = (j) => j.status === 'running' || j.status === 'retrying';
  const isWaiting = (j) => j.status === 'queued' || j.status === 'unschedulable';
  const isFailed = (j) => j.status === 'failed';
  const isEnded = (j) => j.status === 'completed' || j.status === 'cancelled';

  function count(pred) {
    let n = 0;
    for (const j of state.jobs.values()) if (pred(j)) n++;
    return n;
  }

  // trim keeps each list within the limit: the newest ended jobs, the
  // oldest waiting ones.
  function trim() {
    const drop = (pred, order) => {
      const js = [...state.jobs.values()].filter(pred).sort(order);
      for (const j of js.slice(state.limit)) state.jobs.delete(j.id);
    };
    drop(isWaiting, byEnqueued);
    drop(isFailed, byFinishedDesc);
    drop(isEnded, byFinishedDesc);
    for (const id of previews.keys()) {
      const j = state.jobs.get(id);
      if (!j || !isRunning(j)) previews.delete(id);
    }
  }

  const byEnqueued = (a, b) => time(a.enqueued_at) - time(b.enqueued_at);
  const byStarted = (a, b) => time(a.started_at) - time(b.started_at);
  const byFinishedDesc = (a, b) => time(b.finished_at) - time(a.finished_at);

  // --- actions ------------------------------------------------------------

  async function act(label, path, body, btn) {
    btn.disabled = true;
    try {
      const init = { method: 'POST' };
      if (body) init.body = new URLSearchParams(body);
      const r = await fetch(path, init);
      if (r.ok) {
        showMessage(`${label}: done`, false);
        loadOverview();
      } else {
        let msg = `${r.status} ${r.statusText}`;
        try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
        showMessage(`${label}: ${msg}`, true);
      }
    } catch (e) {
      showMessage(`${label}: ${e.message}`, true);
    } finally {
      btn.disabled = false;
    }
  }

  function button(kind, text, label, path, body) {
    if (!state.actions.has(kind)) return null;
    const b = h('button', { type: 'button', dataset: { action: kind }, text });
    b.addEventListener('click', () => act(label, path, body, b));
    return b;
  }

  function jobButtons(j) {
    const path = 'api/jobs/' + encodeURIComponent(j.id);
    return [
      cancellable.has(j.status) ? button('cancel', 'Cancel', `cancel ${j.id}`, path + '/cancel') : null,
      retryable.has(j.status) ? button('retry', 'Retry', `retry ${j.id}`, path + '/retry') : null,
    ];
  }

  function jobActionsKey(j) {
    return [...state.actions].join() + '|' + j.status;
  }

  // --- rendering ----------------------------------------------------------

  function progressNodes(j) {
    const p = j.progress;
    if (!p) return [j.status === 'retrying' ? 'retrying' : '–'];
    return [
      h('progress', { max: p.max || 1, value: p.value }),
      h('span', { class: 'progress-text' }, `node ${p.node}: ${p.value}/${p.max}`),
    ];
  }

  function previewNodes(j) {
    if (!j.preview) return [];
    let img = previews.get(j.id);
    if (!img) {
      img = h('img', { class: 'preview', alt: 'preview' });
      img.addEventListener('error', () => { img.hidden = true; });
      img.addEventListener('load', () => { img.hidden = false; });
      previews.set(j.id, img);
    }
    img.src = 'api/jobs/' + encodeURIComponent(j.id) + '/preview?v=' + j.preview;
    return [img];
  }

  function metadataNodes(m) {
    if (!m) return [];
    return Object.keys(m).sort().map((k) => h('span', { class: 'kv' }, h('b', null, k), '=', m[k]));
  }

  function errorNodes(e) {
    if (!e) return [];
    const where = e.node_id ? ` (node ${e.node_id}${e.node_type ? ' ' + e.node_type : ''})` : '';
    return [h('span', { class: 'error-class' }, e.class || 'error'), ' ', e.message || '', where];
  }

  // Columns: title, the key of what the cell shows (the cell is rebuilt
  // only when it changes), and its content.
  const columns = {
    id: ['Job', (j) => j.id, (j) => [h('code', { class: 'id', title: j.id }, shortId(j.id))]],
    status: ['Status', (j) => j.status, (j) => [h('span', { class: 'status s-' + j.status }, j.status)]],
    backend: ['Backend', (j) => j.backend, (j) => [j.backend || '–']],
    workflow: ['Workflow', (j) => j.workflow, (j) => [h('code', { title: j.workflow }, shortId(j.workflow))]],
    metadata: ['Metadata', (j) => JSON.stringify(j.metadata), (j) => metadataNodes(j.metadata)],
    progress: ['Progress', (j) => JSON.stringify(j.progress) + j.status, progressNodes],
    preview: ['Preview', (j) => String(j.preview), previewNodes],
    enqueued: ['Enqueued', (j) => j.enqueued_at, (j) => [fmtTime(j.enqueued_at)]],
    started: ['Started', (j) => j.started_at, (j) => [fmtTime(j.started_at)]],
    finished: ['Ended', (j) => j.finished_at, (j) => [fmtTime(j.finished_at)]],
    error: ['Error', (j) => JSON.stringify(j.error), (j) => errorNodes(j.error)],
    actions: ['', jobActionsKey, jobButtons],
  };

  const sections = [
    { id: 'running', cols: ['id', 'backend', 'workflow', 'metadata', 'progress', 'preview', 'started', 'actions'], select: isRunning, order: byStarted, counts: ['running', 'retrying'] },
    { id: 'waiting', cols: ['id', 'status', 'workflow', 'metadata', 'enqueued', 'error', 'actions'], select: isWaiting, order: byEnqueued, counts: ['queued', 'unschedulable'] },
    { id: 'failures', cols: ['id', 'backend', 'workflow', 'metadata', 'finished', 'error', 'actions'], select: isFailed, order: byFinishedDesc, counts: ['failed'] },
    { id: 'ended', cols: ['id', 'status', 'backend', 'metadata', 'finished', 'actions'], select: isEnded, order: byFinishedDesc, counts: ['completed', 'cancelled'] },
  ];
  const resultCols = ['id', 'status', 'backend', 'workflow', 'metadata', 'enqueued', 'finished', 'error', 'actions'];

  // fill renders rows into a table, keyed by key(item): rows are kept,
  // their cells rebuilt only when what they show changed, and put in order.
  function fill(table, cols, items, key) {
    const thead = table.tHead;
    if (!thead.rows.length) thead.append(h('tr', null, cols.map((c) => h('th', null, c[0]))));
    const tbody = table.tBodies[0];
    table.rows_ = table.rows_ || new Map();
    const keep = new Set();
    items.forEach((item, i) => {
      const k = key(item);
      keep.add(k);
      let tr = table.rows_.get(k);
      if (!tr) {
        tr = h('tr', { dataset: { key: k } }, cols.map(() => h('td')));
        tr.sig_ = [];
        table.rows_.set(k, tr);
      }
      cols.forEach((c, ci) => {
        const sig = c[1](item);
        if (tr.sig_[ci] !== sig) {
          tr.cells[ci].replaceChildren(...c[2](item).filter((n) => n !== null && n !== undefined));
          tr.sig_[ci] = sig;
        }
      });
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
    });
    for (const [k, tr] of table.rows_) {
      if (!keep.has(k)) { tr.remove(); table.rows_.delete(k); }
    }
    table.classList.toggle('empty', items.length === 0);
  }

  function renderJobs(table, colNames, jobs) {
    fill(table, colNames.map((n) => columns[n]), jobs, (j) => j.id);
    for (const tr of table.tBodies[0].rows) tr.dataset.job = tr.dataset.key;
  }

  function render() {
    const o = state.overview;
    for (const s of sections) {
      const jobs = [...state.jobs.values()].filter(s.select).sort(s.order).slice(0, state.limit);
      renderJobs(document.getElementById(s.id), s.cols, jobs);
      let total = jobs.length;
      if (o && o.jobs) total = Math.max(total, s.counts.reduce((n, c) => n + (o.jobs[c] || 0), 0));
      document.getElementById(s.id + '-count').textContent = total > jobs.length ? `${jobs.length} of ${total}` : String(jobs.length);
    }
    const results = state.results.map((id) => state.resultJobs.get(id)).filter(Boolean);
    renderJobs(document.getElementById('results'), resultCols, results);
    renderOverview();
  }

  function renderOverview() {
    const o = state.overview;
    if (!o) return;
    const q = document.getElementById('queue');
    const parts = [];
    const statuses = ['queued', 'unschedulable', 'running', 'retrying', 'completed', 'failed', 'cancelled'];
    parts.push(h('span', { class: 'stat' }, h('b', null, 'depth'), ' ', String((o.jobs.queued || 0) + (o.jobs.unschedulable || 0) + (o.jobs.retrying || 0))));
    if (o.queue) parts.push(h('span', { class: 'stat' }, h('b', null, 'oldest queued'), ' ', o.queue.oldest_queued_seconds ? fmtAge(o.queue.oldest_queued_seconds) : '–'));
    for (const s of statuses) parts.push(h('span', { class: 'stat s-' + s }, h('b', null, s), ' ', String(o.jobs[s] || 0)));
    if (o.events_dropped) parts.push(h('span', { class: 'stat' }, h('b', null, 'events dropped'), ' ', String(o.events_dropped)));
    const paused = o.paused || [];
    const all = paused.some((p) => !p.workflow && !p.tag);
    const pausedNodes = paused.map((p) => {
      const what = p.workflow ? `workflow ${shortId(p.workflow)}` : p.tag ? `tag ${p.tag}` : 'the whole queue';
      const body = p.workflow ? { workflow: p.workflow } : p.tag ? { tag: p.tag } : null;
      return h('span', { class: 'paused', dataset: { scope: what } }, `paused: ${what} `, button('resume', 'Resume', `resume ${what}`, 'api/resume', body));
    });
    const pause = all ? null : button('pause', 'Pause queue', 'pause the queue', 'api/pause', null);
    q.replaceChildren(
      h('div', { class: 'stats' }, parts),
      h('div', { class: 'pauses' }, pausedNodes.length ? pausedNodes : h('span', { class: 'info' }, 'dispatching'), pause),
      ...(o.error ? [h('p', { class: 'message error' }, o.error)] : []),
    );

    const bcols = [
      ['Backend', (b) => b.name, (b) => [h('b', null, b.name), b.tags && b.tags.length ? h('span', { class: 'tags' }, ' ', b.tags.join(', ')) : null]],
      ['State', (b) => [b.state, b.draining, b.held_elsewhere, b.handing_over, b.holder].join(), (b) => [
        h('span', { class: 'state st-' + b.state }, b.state),
        b.draining ? h('span', { class: 'flag' }, 'draining') : null,
        b.held_elsewhere ? h('span', { class: 'flag' }, 'held by ' + (b.holder || 'another pool')) : null,
        b.handing_over ? h('span', { class: 'flag' }, 'handing over') : null,
      ]],
      ['In flight', (b) => `${b.in_flight}/${b.max_in_flight}`, (b) => [`${b.in_flight}/${b.max_in_flight}`]],
      ['Server queue', (b) => String(b.server_queue), (b) => [String(b.server_queue)]],
      ['VRAM free', (b) => String(b.vram_free || 0), (b) => [fmtBytes(b.vram_free)]],
      ['Warm workflow', (b) => b.warm_workflow || '', (b) => [b.warm_workflow ? h('code', { title: b.warm_workflow }, shortId(b.warm_workflow)) : '–']],
      ['Blocked', (b) => JSON.stringify(b.blocked || []), (b) => (b.blocked || []).map((x) =>
        h('div', { class: 'blocked' }, h('code', { title: x.workflow }, shortId(x.workflow)), ' until ', fmtTime(x.until)))],
      ['', (b) => [...state.actions].join() + b.draining, (b) => [b.draining ? null :
        button('drain', 'Drain', `drain ${b.name}`, 'api/backends/' + encodeURIComponent(b.name) + '/drain', null)]],
    ];
    const table = document.getElementById('backends');
    fill(table, bcols, o.backends || [], (b) => b.name);
    for (const tr of table.tBodies[0].rows) tr.dataset.backend = tr.dataset.key;
    document.getElementById('backends-count').textContent = String((o.backends || []).length);
    document.getElementById('mode').textContent = state.actions.size ? '' : 'read-only';
  }

  // --- reading ------------------------------------------------------------

  async function loadSnapshot() {
    if (state.loading) return state.loading;
    state.loading = (async () => {
      try {
        const r = await fetch('api/snapshot');
        if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
        const s = await r.json();
        const at = time(s.time);
        const actions = new Set(s.actions);
        if ([...actions].join() !== [...state.actions].join()) {
          // Buttons appear or go: rebuild every row.
          for (const t of document.querySelectorAll('table')) { t.rows_ = null; t.tBodies[0].replaceChildren(); }
        }
        state.actions = actions;
        state.limit = s.limit;
        state.overview = s.overview;
        const fresh = new Map();
        for (const list of [s.running, s.waiting, s.failures, s.ended]) {
          for (const v of list) fresh.set(v.job.id, fromView(v));
        }
        // An event newer than the snapshot wins over it.
        for (const [id, j] of state.jobs) {
          if (j.updated > at) {
            const f = fresh.get(id);
            if (f) { j.metadata = j.metadata || f.metadata; j.workflow = j.workflow || f.workflow; j.detailed = true; }
            fresh.set(id, j);
          }
        }
        state.jobs = fresh;
        trim();
        render();
      } catch (e) {
        showMessage('reading the pool: ' + e.message, true);
      } finally {
        state.loading = null;
      }
    })();
    return state.loading;
  }

  async function loadOverview() {
    try {
      const r = await fetch('api/overview');
      if (r.ok) { state.overview = await r.json(); renderOverview(); }
    } catch (e) { /* the stream brings the next one */ }
  }

  function parseQuery(text) {
    const words = text.trim().split(/\s+/).filter(Boolean);
    if (!words.length) return null;
    const p = new URLSearchParams();
    if (words.every((w) => w.indexOf('=') > 0)) {
      for (const w of words) p.append('meta', w);
    } else if (words.length === 1) {
      p.set('id', words[0]);
    } else {
      return undefined;
    }
    return p;
  }

  async function search(p, append) {
    const info = document.getElementById('search-info');
    try {
      const r = await fetch('api/jobs?' + p.toString());
      const page = await r.json();
      if (!r.ok) throw new Error(page.error || r.statusText);
      if (!append) { state.results = []; state.resultJobs = new Map(); }
      for (const v of page.jobs) {
        const j = fromView(v);
        if (!state.resultJobs.has(j.id)) state.results.push(j.id);
        state.resultJobs.set(j.id, j);
      }
      state.next = page.next || '';
      document.getElementById('more').hidden = !state.next;
      info.textContent = state.results.length ? `${state.results.length} found` : 'no job found';
      render();
    } catch (e) {
      info.textContent = 'search: ' + e.message;
    }
  }

  function setupSearch() {
    document.getElementById('search').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const p = parseQuery(document.getElementById('q').value);
      if (p === undefined) {
        document.getElementById('search-info').textContent = 'give one job id, or key=value pairs';
        return;
      }
      state.query = p;
      if (!p) { state.results = []; state.resultJobs = new Map(); render(); return; }
      search(p, false);
    });
    document.getElementById('more').addEventListener('click', (ev) => {
      ev.preventDefault();
      if (!state.query || !state.next) return;
      const p = new URLSearchParams(state.query);
      p.set('cursor', state.next);
      search(p, true);
    });
  }

  function connect() {
    const es = new EventSource('api/events');
    es.addEventListener('open', () => {
      state.stopped = false;
      setConn('live', 'live');
      loadSnapshot();
    });
    es.addEventListener('error', () => {
      if (!state.stopped) setConn('reconnecting…', 'down');
    });
    es.addEventListener('jobs', (e) => onDeltas(JSON.parse(e.data)));
    es.addEventListener('overview', (e) => {
      state.overview = JSON.parse(e.data);
      render();
    });
    es.addEventListener('resync', () => loadSnapshot());
    es.addEventListener('stopped', () => {
      state.stopped = true;
      setConn('pool stopped', 'down');
    });
  }

  setupSearch();
  connect();
  // Jobs of other pools on a shared queue show no events: read again now
  // and then.
  setInterval(() => { if (!document.hidden) loadSnapshot(); }, 30000);
})();
