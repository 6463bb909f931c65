// The status page: polls this Edge's admin reads and draws them. Nothing
// is loaded from anywhere else. Every value shown is set as text, never as
// markup: model, Node and principal names come from outside the Edge.
'use strict';
(() => {
  const params = new URLSearchParams(location.search);
  // ?interval=MS polls faster or slower (at least 200 ms); 1 s by default.
  const interval = Math.max(200, Number(params.get('interval')) || 1000);
  const KEY = 'iop-admin-key';
  let key = sessionStorage.getItem(KEY) || '';
  let timer = 0;
  let skew = 0; // the Edge's clock minus this browser's, in ms

  const $ = (id) => document.getElementById(id);

  // el makes an element: props may hold class, text, title and data (an
  // object of data-* attributes); children are nodes or strings.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      if (props.class) e.className = props.class;
      if (props.text !== undefined) e.textContent = String(props.text);
      if (props.title) e.title = props.title;
      if (props.data) for (const [k, v] of Object.entries(props.data)) e.dataset[k] = String(v);
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const badge = (cls, text) => el('span', { class: 'badge ' + cls, text: text || cls });
  const td = (props, ...children) => el('td', props, ...children);

  function fmtDur(ms) {
    if (ms === null || ms === undefined || isNaN(ms)) return '–';
    if (ms < 1000) return Math.round(ms) + ' ms';
    const s = ms / 1000;
    if (s < 60) return s.toFixed(1) + ' s';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + Math.floor(s % 60) + 's';
    return Math.floor(m / 60) + 'h ' + (m % 60) + 'm';
  }
  const since = (ts) => (ts ? Date.now() + skew - Date.parse(ts) : null);
  const ago = (ts) => (ts ? fmtDur(since(ts)) + ' ago' : '–');

  // meter draws used of total as a bar, labelled by label (used / total
  // when absent); a full one stands out.
  function meter(used, total, label) {
    const m = el('span', { class: 'meter' + (total > 0 && used >= total ? ' full' : '') });
    const track = el('span', { class: 'track' });
    const fill = el('span', { class: 'fill' });
    fill.style.width = (total > 0 ? Math.min(100, (100 * used) / total) : 0) + '%';
    track.append(fill);
    m.append(track, label || used + ' / ' + total);
    return m;
  }

  // reasonClass groups a terminal reason for its color.
  function reasonClass(r) {
    if (r === 'completed') return 'completed';
    if (r === 'cancelled' || r === 'idle_timeout') return 'cancelled';
    if (r === 'other') return 'other';
    return 'failed';
  }

  function fill(id, rows, cols, emptyText) {
    const body = $(id).tBodies[0];
    if (rows.length === 0) rows = [el('tr', null, td({ class: 'empty', text: emptyText }))];
    if (rows[0].cells.length === 1 && cols) rows[0].cells[0].colSpan = cols;
    body.replaceChildren(...rows);
  }

  // edgeChips shows the Edges a Node is connected to (the cluster view's
  // links), each with its connection's state there.
  function edgeChips(links, self) {
    const cell = td({ class: 'wrap' });
    for (const l of links || []) {
      const state = l.suspect && l.state === 'ready' ? 'suspect' : l.state;
      cell.append(el('span', { class: 'chip' + (l.edge === self ? ' self' : ''), data: { edge: l.edge, state: state },
        title: 'generation ' + l.generation + ', connected ' + ago(l.since) }, l.edge + ' ', badge(state)));
    }
    if (!(links || []).length) cell.append(el('span', { class: 'muted', text: '–' }));
    return cell;
  }

  // fmtBytes is a size in GiB or MiB.
  function fmtBytes(n) {
    if (!n) return '0';
    if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + ' GiB';
    return Math.round(n / (1 << 20)) + ' MiB';
  }

  // loadedLine shows what a provider's server holds loaded (issue 23: the
  // Edge routes warm first by it): each model with its size (in VRAM),
  // the runs on it and when it is unloaded; nothing when the Node does
  // not say.
  function loadedLine(p) {
    const l = p.loaded;
    if (!l) return null;
    const line = el('div', { class: 'targets', data: { loaded: '' } }, 'loaded' + (l.max ? ' (at most ' + l.max + ')' : '') + ': ');
    if (l.all) {
      line.append('every model');
      return line;
    }
    if (!(l.models || []).length) line.append(el('span', { class: 'muted', text: 'none' }));
    (l.models || []).forEach((m, i) => {
      const left = m.expires_at ? Date.parse(m.expires_at) - Date.now() - skew : null;
      const parts = [fmtBytes(m.size) + (m.size_vram && m.size_vram !== m.size ? ', ' + fmtBytes(m.size_vram) + ' VRAM' : '')];
      if (m.in_use) parts.push(m.in_use + ' running');
      if (left !== null) parts.push(left > 0 ? 'unloads in ' + fmtDur(left) : 'unloading');
      line.append(i ? ', ' : '', el('span', { class: 'chip', data: { model: m.name }, text: m.name }), ' ' + parts.join(' · '));
    });
    return line;
  }

  function renderNodes(nodes, cluster) {
    const links = {};
    for (const n of (cluster && cluster.nodes) || []) links[n.id] = n.edges;
    const self = cluster && cluster.self;
    const rows = nodes.map((n) => {
      // A suspect Node keeps its generation's state but takes no work:
      // it is shown as suspect, not ready, with how long it was silent.
      const state = el('td', null, n.suspect && n.state === 'ready' ? badge('suspect') : badge(n.state));
      if (n.suspect && n.state !== 'ready') state.append(' ', badge('suspect'));
      if (n.fence_reason) state.append(el('div', { class: 'small muted', text: n.fence_reason + (n.fenced_at ? ' · ' + ago(n.fenced_at) : '') }));
      if (n.suspect) {
        const silent = n.heard_again_at ? n.silent_for_ms : (n.silent_since ? since(n.silent_since) : n.silent_for_ms);
        state.append(el('div', { class: 'small muted', data: { silent: '' },
          text: 'silent ' + fmtDur(silent) + (n.heard_again_at ? ' · heard again ' + ago(n.heard_again_at) + ', waiting for a heartbeat answer' : '') }));
      }
      const providers = td({ class: 'wrap' });
      for (const p of n.providers || []) {
        const div = el('div', { class: 'provider', data: { provider: p.name, state: p.state } },
          el('div', { class: 'head' }, el('strong', { text: p.name }), badge(p.state), el('span', { class: 'chip', text: p.adapter || '?' }),
            meter(p.in_flight || 0, p.capacity || 0)));
        if ((p.targets || []).length) div.append(el('div', { class: 'targets', text: 'targets: ' + p.targets.join(', ') }));
        const loaded = loadedLine(p);
        if (loaded) div.append(loaded);
        for (const t of p.unhealthy_targets || []) {
          const ev = (p.evidence || {})[t] || {};
          const why = [];
          why.push(ev.source === 'node_report' ? "the Node's own probe found it unavailable" : 'a stall probe found it unavailable');
          if (ev.last_classification) why.push('last stall: ' + ev.last_classification + (ev.last_observed_at ? ' ' + ago(ev.last_observed_at) : ''));
          if (ev.observation_seq) why.push('observation #' + ev.observation_seq);
          div.append(el('div', { class: 'evidence', data: { target: t } }, badge('unhealthy'), ' ' + t + ': ' + why.join(' · ')));
        }
        for (const [t, count] of Object.entries(p.stalls || {})) {
          if ((p.unhealthy_targets || []).includes(t)) continue;
          div.append(el('div', { class: 'targets', text: t + ': ' + count + ' consecutive stall' + (count === 1 ? '' : 's') }));
        }
        providers.append(div);
      }
      if (!(n.providers || []).length) providers.append(el('span', { class: 'muted', text: 'no providers' }));
      return el('tr', { data: { node: n.id, state: n.state, suspect: !!n.suspect, generation: n.generation } },
        td(null, el('strong', { text: n.id }), el('div', { class: 'small muted mono', text: n.identity || '' }),
          n.version ? el('div', { class: 'small muted', text: 'v' + n.version }) : null),
        state,
        td({ class: 'mono', text: n.generation }),
        td({ class: 'num', text: n.last_heartbeat_rtt_ms === undefined ? '–' : n.last_heartbeat_rtt_ms.toFixed(2) + ' ms' }),
        td({ text: n.state === 'fenced' ? 'gone' : ago(n.connected_at), title: n.connected_at }),
        cluster ? edgeChips(links[n.id], self) : td({ class: 'muted', text: '–' }),
        providers);
    });
    // Nodes connected to other Edges of the cluster only.
    const here = new Set(nodes.map((n) => n.id));
    for (const n of (cluster && cluster.nodes) || []) {
      if (here.has(n.id)) continue;
      rows.push(el('tr', { data: { node: n.id, state: 'elsewhere' } },
        td(null, el('strong', { text: n.id })),
        td(null, badge('elsewhere', 'other Edges only')),
        td({ class: 'muted', text: '–' }), td({ class: 'num muted', text: '–' }), td({ class: 'muted', text: '–' }),
        edgeChips(n.edges, self),
        td({ class: 'muted', text: 'not connected to this Edge' })));
    }
    fill('nodes', rows, 7, 'No Node has connected yet.');
  }

  // renderWake shows the Nodes this Edge can wake (issue 23): sleeping,
  // waking (since when, for which model, through whom, packets sent) or
  // awake, the models a request wakes them for, who can wake them, and
  // the last wake. Hidden while no Node lists a machine to wake.
  function renderWake(w) {
    const nodes = (w && w.nodes) || [];
    $('wake').hidden = nodes.length === 0;
    if (!nodes.length) return;
    const rows = nodes.map((n) => {
      const state = td(null, badge(n.state));
      if (n.state === 'waking') {
        state.append(el('div', { class: 'small muted', text: 'since ' + ago(n.waking_since) + ' for ' + n.waking_for +
          ' via ' + (n.via || '–') + ' · ' + (n.packets || 0) + ' packet' + (n.packets === 1 ? '' : 's') }));
      }
      const wakers = td({ class: 'wrap' });
      for (const k of n.wakers || []) {
        wakers.append(el('span', { class: 'chip', data: { waker: k.node, connected: k.connected } },
          k.node + ' ', badge(k.connected ? 'ready' : 'offline', k.connected ? 'connected' : 'not connected')));
      }
      const last = td({ text: n.last_woke_at ? 'woke in ' + fmtDur(n.last_wake_ms) + ' via ' + n.last_via + ', ' + ago(n.last_woke_at) : '–' });
      if (n.last_timed_out_at) last.append(el('div', { class: 'small muted', text: 'last wake timed out ' + ago(n.last_timed_out_at) }));
      return el('tr', { data: { wake: n.node, state: n.state } },
        td(null, el('strong', { text: n.node })), state,
        td({ class: 'wrap mono', text: (n.models || []).join(', ') || '–' }), wakers, last);
    });
    fill('wakes', rows, 5, '');
  }

  // edgeState is an Edge's state as the page shows it.
  function edgeState(e) {
    if (!e.alive) return 'dead';
    return e.stopping ? 'stopping' : 'alive';
  }

  function renderCluster(c) {
    $('cluster').hidden = !c;
    if (!c) return;
    $('clusternote').textContent = !c.clustered
      ? 'this Edge alone: no cluster configured'
      : (c.database === 'unreachable' ? 'the cluster database is unreachable: the other Edges as last known' : 'the cluster as this Edge sees it');
    const rows = (c.edges || []).map((e) => {
      const state = edgeState(e);
      const config = td(null, el('span', { class: 'mono', title: e.config_hash || '', text: e.config_hash ? e.config_hash.replace('sha256:', '').slice(0, 12) : '–' }));
      if (e.config_differs) config.append(' ', badge('differs', 'differs'));
      return el('tr', { data: { edge: e.id, state: state, differs: !!e.config_differs } },
        td(null, el('strong', { text: e.id }), e.self ? ' ' : null, e.self ? el('span', { class: 'chip self', text: 'this Edge' }) : null,
          e.version ? el('div', { class: 'small muted', text: 'v' + e.version }) : null),
        td(null, badge(state), state === 'dead' ? el('div', { class: 'small muted', text: 'last heard ' + ago(e.heartbeat_at) }) : null),
        td(null, el('div', { class: 'mono', text: 'quic ' + (e.quic_address || '–') }), el('div', { class: 'mono', text: 'http ' + (e.http_address || '–') })),
        td({ class: 'num', text: e.self ? '–' : fmtDur(e.heartbeat_age_ms) }),
        config,
        td({ class: 'num', text: e.nodes }));
    });
    fill('edges', rows, 6, 'No Edge is known.');
  }

  function renderModels(models) {
    const rows = (models || []).map((m) => {
      const serving = td({ class: 'wrap' });
      for (const s of m.serving || []) serving.append(el('span', { class: 'chip', text: s.node + ' / ' + s.provider + ' (' + s.in_flight + '/' + s.capacity + ')' }));
      if (!(m.serving || []).length) serving.append(el('span', { class: 'muted', text: 'no Node now' }));
      return el('tr', { data: { model: m.model } },
        td({ class: 'mono', text: m.model }), serving,
        td(null, meter(m.capacity - m.free, m.capacity, m.free + ' free of ' + m.capacity)),
        td({ class: 'num', text: m.queue_depth }),
        td({ class: 'num', text: m.queue_depth ? fmtDur(m.oldest_wait_ms) : '–' }));
    });
    fill('models', rows, 5, 'No model is served now.');
  }

  function renderLive(live) {
    const rows = live.map((r) => el('tr', { data: { id: r.id, kind: r.kind, phase: r.phase, model: r.model, node: r.node || '' } },
      td({ class: 'id', title: r.kind + (r.attempts > 1 ? ', attempt ' + r.attempts : '') }, r.id, el('div', { class: 'small muted', text: r.kind })),
      td({ text: r.api || '–' }),
      td({ class: 'mono', text: r.model }),
      td({ text: r.principal || '–' }),
      td({ text: r.node ? r.node + ' / ' + r.provider : '–' }),
      td(null, badge(r.phase)),
      td({ class: 'num', text: fmtDur(r.age_ms) }),
      td({ class: 'num', text: r.ttft_ms === undefined ? '–' : fmtDur(r.ttft_ms) }),
      td({ class: 'num', text: r.tokens }),
      td({ class: 'num', text: r.tokens_per_second ? r.tokens_per_second.toFixed(1) : '–' })));
    fill('live', rows, 10, 'Nothing in flight.');
  }

  function renderTerminals(t) {
    const minutes = t.minutes || [];
    $('window').textContent = 'last ' + t.window_minutes + ' minutes';
    $('windowhead').textContent = t.window_minutes + ' min';
    const sum = (reason, n) => minutes.slice(-n).reduce((a, m) => a + (m.counts[reason] || 0), 0);
    const reasons = Object.keys(t.totals || {}).sort((a, b) =>
      (a === 'completed' ? -1 : b === 'completed' ? 1 : 0) || t.totals[b] - t.totals[a] || a.localeCompare(b));
    const rows = reasons.map((reason) => {
      const spark = el('div', { class: 'spark', title: 'per minute, oldest first' });
      const peak = Math.max(1, ...minutes.map((m) => m.counts[reason] || 0));
      for (const m of minutes) {
        const c = m.counts[reason] || 0;
        const bar = el('i', { class: c ? '' : 'zero', title: new Date(m.start).toLocaleTimeString() + ': ' + c });
        bar.style.height = (c ? Math.max(12, (100 * c) / peak) : 6) + '%';
        spark.append(bar);
      }
      return el('tr', { data: { reason: reason, total: t.totals[reason] } },
        td(null, badge(reasonClass(reason), reason)),
        td({ class: 'num', text: sum(reason, 1) }),
        td({ class: 'num', text: sum(reason, 5) }),
        td({ class: 'num', text: t.totals[reason] }),
        td(null, spark));
    });
    fill('terminals', rows, 5, 'Nothing ended in the window.');
  }

  function renderRecent(recent) {
    const rows = recent.map((r) => el('tr', { data: { id: r.id, reason: r.reason } },
      td({ class: 'id', text: r.id }),
      td({ class: 'mono', text: r.model }),
      td({ text: r.node || '–' }),
      td(null, badge(reasonClass(r.reason), r.reason)),
      td({ class: 'num', text: r.ttft_ms === undefined ? '–' : fmtDur(r.ttft_ms) }),
      // The provider's own count once it reported one, else the deltas seen.
      td({ class: 'num', text: r.completion_tokens || r.tokens }),
      td({ class: 'num', text: fmtDur(r.age_ms) })));
    fill('recent', rows, 7, 'Nothing has ended yet.');
  }

  // clusterTiles: the Edges alive, and which differ in configuration.
  function clusterTiles(tile, c) {
    if (!c) return [];
    const edges = c.edges || [];
    const alive = edges.filter((e) => e.alive).length;
    const out = [tile('edges', alive + ' / ' + edges.length, c.clustered ? 'Edges alive' + (c.database === 'unreachable' ? ' (database unreachable: as last known)' : '') : 'Edge, alone')];
    const differ = edges.filter((e) => e.config_differs).map((e) => e.id);
    if (differ.length) out.push(tile('configdiffers', differ.length, 'configuration differs from the others: ' + differ.join(', ')));
    return out;
  }

  function renderTiles(nodes, queues, runs, cluster) {
    const ready = nodes.filter((n) => n.state === 'ready' && !n.suspect).length;
    const phases = { queued: 0, prefill: 0, streaming: 0 };
    for (const r of runs.live) phases[r.phase] = (phases[r.phase] || 0) + 1;
    const waiting = (queues.queues || []).reduce((a, q) => a + q.depth, 0);
    const totals = runs.terminals.totals || {};
    let done = 0, notDone = 0;
    for (const [r, c] of Object.entries(totals)) {
      if (r === 'completed') done += c; else notDone += c;
    }
    const tile = (id, n, label) => el('div', { class: 'tile', data: { tile: id } }, el('div', { class: 'n', text: n }), el('div', { class: 'l', text: label }));
    $('tiles').replaceChildren(
      ...clusterTiles(tile, cluster),
      tile('nodes', ready + ' / ' + nodes.length, 'Nodes ready'),
      tile('live', runs.live.length, 'in flight'),
      tile('prefill', phases.prefill, 'in prefill'),
      tile('streaming', phases.streaming, 'streaming'),
      tile('queued', waiting, 'waiting in queues'),
      tile('completed', done, 'completed, ' + runs.terminals.window_minutes + ' min'),
      tile('failed', notDone, 'did not complete, ' + runs.terminals.window_minutes + ' min'),
      sessionTile(tile, queues.sessions),
      ...notYetBackTile(tile, queues.not_yet_back));
  }

  // After a restart the Edge answers the models it served before with 503
  // retry until their Nodes are back (or, without a data_dir, every model
  // no Node offers yet, for a while): shown only while that lasts.
  function notYetBackTile(tile, v) {
    if (!v || (!(v.models || []).length && !v.grace)) return [];
    const names = (v.models || []).map((m) => m.model + ' (' + m.nodes.join(', ') + ')');
    const until = v.until ? ' until ' + new Date(v.until).toLocaleTimeString() : '';
    const label = v.grace
      ? 'just restarted: unknown models answered "retry"' + until
      : 'models answered "retry" while their Nodes reconnect' + until + ': ' + names.join('; ');
    return [tile('notyetback', v.grace ? 'restarted' : names.length, label)];
  }

  // Session affinity: of the turns whose session had run before, how many
  // ran where its last turn did (its server's prompt cache); the rest moved
  // because that place was busy, gone, or failed them.
  function sessionTile(tile, s) {
    const t = (s && s.turns) || {};
    const moved = (t.moved_busy || 0) + (t.moved_gone || 0) + (t.moved_failover || 0);
    const label = 'session turns on their last server · ' + ((s && s.sessions) || 0) + ' sessions' +
      (moved ? ' · moved: ' + (t.moved_busy || 0) + ' busy, ' + (t.moved_gone || 0) + ' gone, ' + (t.moved_failover || 0) + ' failed' : '');
    return tile('sessions', (t.stuck || 0) + ' / ' + ((t.stuck || 0) + moved), label);
  }

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.state = state;
    c.textContent = text;
  }

  class Locked extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // getJSON reads path; optional: a 404 (an Edge without that read) is
  // null rather than an error.
  async function getJSON(path, optional) {
    const headers = key ? { Authorization: 'Bearer ' + key } : {};
    const r = await fetch(path, { headers, cache: 'no-store', credentials: 'omit' });
    if (r.status === 401 || r.status === 403) {
      const body = await r.json().catch(() => ({}));
      throw new Locked(r.status, body.error || r.statusText);
    }
    if (optional && r.status === 404) return null;
    if (!r.ok) throw new Error(path + ' answered ' + r.status);
    return r.json();
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(tick, interval);
  }

  async function tick() {
    const wake = getJSON('admin/v1/wake', true).catch(() => null); // an Edge without wake on demand: none
    try {
      // Relative paths: the page works behind a proxy that adds a prefix.
      const [nodes, queues, runs, cluster] = await Promise.all([getJSON('admin/v1/nodes'), getJSON('admin/v1/queues'), getJSON('admin/v1/runs'),
        getJSON('admin/v1/cluster', true)]);
      skew = Date.parse(runs.now) - Date.now();
      renderWake(await wake);
      renderTiles(nodes.nodes, queues, runs, cluster);
      renderCluster(cluster);
      renderNodes(nodes.nodes, cluster);
      renderModels(queues.models);
      renderLive(runs.live);
      renderTerminals(runs.terminals);
      renderRecent(runs.recent);
      document.body.dataset.loaded = 'true';
      setConn('live', 'live · updated ' + new Date().toLocaleTimeString() + ' · every ' + interval + ' ms');
      schedule();
    } catch (e) {
      if (e instanceof Locked) {
        lock(e);
        return; // no polling until there is a key to try
      }
      setConn('error', 'cannot read this Edge (' + e.message + '); retrying');
      schedule();
    }
  }

  // lock asks for an admin key: reads are not open to this caller.
  function lock(e) {
    $('main').hidden = true;
    $('keyform').hidden = false;
    $('keywhy').textContent = key
      ? 'The key was refused (' + e.status + '): ' + e.message
      : "This Edge shows its status to admins only: enter the API key of a principal with admin: true.";
    setConn('locked', 'admin key needed');
    $('key').focus();
  }

  $('keyform').addEventListener('submit', (ev) => {
    ev.preventDefault();
    key = $('key').value.trim();
    $('key').value = '';
    sessionStorage.setItem(KEY, key);
    $('keyform').hidden = true;
    $('main').hidden = false;
    $('forget').hidden = !key;
    tick();
  });
  $('forget').addEventListener('click', () => {
    sessionStorage.removeItem(KEY);
    key = '';
    $('forget').hidden = true;
    tick();
  });
  $('forget').hidden = !key;
  tick();
})();
