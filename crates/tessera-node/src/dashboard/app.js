// Tessera's dashboard. It reads only the public REST API, with the token
// the user signs in with (kept in this tab's session storage), and draws
// everything itself: no library, no build step, nothing fetched from
// elsewhere. Every value from the API reaches the page as text, never as
// markup.
'use strict';

const TOKEN_KEY = 'tessera-token';
const REFRESH_MS = 5000;
const HOUR_MS = 3600 * 1000;
const MINUTE_MS = 60 * 1000;
const COLORS = ['#3b78c4', '#d9534f', '#2e8b57', '#8e44ad', '#e08e0b', '#16a2b8', '#6c757d', '#b5651d'];

const state = {
  intervals: [],   // ActivityInterval, oldest first
  lastEndMs: 0,
  hosts: [],       // host ids, for the charts
  peers: new Map(), // host id -> its calls to each other host
  selected: null,  // the volume whose component tree is shown
  timer: null,
};

class Unauthorized extends Error {}

function $(id) { return document.getElementById(id); }

// An element with properties and children (strings become text nodes).
function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'onclick') e.addEventListener('click', v);
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function badge(word) {
  return el('span', { class: 'badge ' + String(word).split(/[:\s]/)[0] }, word);
}

function bytes(n) {
  if (n === null || n === undefined) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[i];
}

function count(n) { return Number(n).toLocaleString('en-US'); }

function seconds(s) {
  if (s === null || s === undefined) return '-';
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
  return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
}

function clock(ms) { return new Date(ms).toLocaleTimeString('en-GB'); }

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY) || '';
  const answer = await fetch(path, {
    headers: { Authorization: 'Bearer ' + token },
    cache: 'no-store',
  });
  if (answer.status === 401) throw new Unauthorized('the cluster does not accept this token');
  const body = await answer.json().catch(() => null);
  if (!answer.ok) throw new Error((body && body.message) || `${path}: HTTP ${answer.status}`);
  return body;
}

function table(id, headers, rows) {
  const t = $(id);
  t.replaceChildren(
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { class: h.num ? 'num' : '' }, h.title || h)))),
    el('tbody', {}, rows),
  );
}

function cell(value, num) { return el('td', { class: num ? 'num' : '' }, value); }

// --- Health, capacity, hosts, volumes, resyncs (GET /v1/status) ---

function renderStatus(s) {
  $('cluster').textContent = s.cluster;
  $('health-badge').className = 'badge ' + s.health;
  $('health-badge').textContent = s.health;

  const checks = s.checks.map((c) => el('div', { class: 'check ' + c.severity, 'data-code': c.code },
    el('div', {}, el('span', { class: 'code' }, c.code), ' ', badge(c.severity), ' ', c.summary),
    c.affects.length ? el('div', {}, 'Affects: ', c.affects.join(', ')) : null,
    el('div', { class: 'remedy' }, 'Remedy: ', c.remedy,
      c.seconds_left !== undefined && c.seconds_left !== null ? ` (${seconds(c.seconds_left)} left)` : ''),
  ));
  $('checks').replaceChildren(...(checks.length ? checks : [el('p', {}, 'No problems found: every volume is protected as its policy asks.')]));

  renderCapacity(s.capacity, s.hosts);
  renderHosts(s.hosts);
  renderVolumes(s.volumes);
  renderResyncs(s.resyncs);
}

function renderCapacity(c, hosts) {
  let logical = 0;
  let physical = 0;
  for (const h of hosts) {
    for (const g of h.disk_groups) {
      if (g.physical_bytes !== null && g.physical_bytes !== undefined) {
        logical += g.capacity.used_bytes;
        physical += g.physical_bytes;
      }
    }
  }
  const saved = Math.max(0, logical - physical);
  const used = c.total_bytes ? (100 * (c.total_bytes - Math.min(c.free_bytes, c.total_bytes)) / c.total_bytes) : 0;
  $('capacity').replaceChildren(el('table', {}, el('tbody', {},
    el('tr', {}, el('th', {}, 'Datastore'), cell(bytes(c.total_bytes), true)),
    el('tr', {}, el('th', {}, 'Used'), cell(`${bytes(c.used_bytes)} (${used.toFixed(1)}% taken with reservations)`, true)),
    el('tr', {}, el('th', {}, 'Reserved for thick volumes'), cell(bytes(c.reserved_bytes), true)),
    el('tr', {}, el('th', {}, 'Free'), cell(bytes(c.free_bytes), true)),
    el('tr', {}, el('th', {}, 'Provisioned'), cell(`${bytes(c.provisioned_bytes)} (${c.overcommit_ratio.toFixed(2)}x the datastore)`, true)),
    el('tr', {}, el('th', {}, 'Saved by shared blocks (clones, EXTENDED COPY)'), cell(bytes(saved), true)),
  )));
}

function renderHosts(hosts) {
  state.hosts = hosts.map((h) => h.id);
  const rows = [];
  for (const h of hosts) {
    const down = h.state !== 'present';
    const cache = h.read_cache && h.read_cache.hit_rate !== null && h.read_cache.hit_rate !== undefined
      ? (100 * h.read_cache.hit_rate).toFixed(1) + '%' : '-';
    rows.push(el('tr', { class: down ? 'host down' : 'host', 'data-host': h.id },
      el('td', {}, el('strong', {}, h.id)), cell(h.fault_domain), el('td', {}, badge(h.state)),
      cell(h.nbd_addr), cell(h.iscsi_addr),
      cell(h.owned_volumes.length, true),
      cell(`${bytes(h.capacity.used_bytes)} of ${bytes(h.capacity.total_bytes)}`, true),
      cell(cache, true),
      cell(roundTrips(h.id)),
    ));
    for (const g of h.disk_groups) {
      rows.push(el('tr', { class: 'disk-group' + (down ? ' down' : (g.health === 'healthy' ? '' : ' degraded')), 'data-host': h.id },
        cell(''), cell('disk group ' + g.id), el('td', {}, badge(g.health)), cell(`${g.components} component${g.components === 1 ? '' : 's'}`),
        cell(g.encryption ? 'encrypted' : 'plaintext'), cell(''),
        cell(`${bytes(g.capacity.used_bytes)} of ${bytes(g.capacity.total_bytes)}`, true), cell(''), cell(''),
      ));
    }
  }
  table('hosts', ['Host', 'Fault domain', 'State', 'NBD', 'iSCSI', { title: 'Owns', num: true },
    { title: 'Used', num: true }, { title: 'Read cache hits', num: true }, 'Mean round trip to'], rows);
}

// A host's mean round trip to each host it called (since it started).
function roundTrips(host) {
  const peers = state.peers.get(host) || [];
  return peers
    .filter((p) => p.calls > p.call_errors)
    .map((p) => `${p.peer} ${Math.round(p.round_trip_ns / (p.calls - p.call_errors) / 1000)} us`
      + (p.call_errors ? ` (${count(p.call_errors)} failed)` : ''))
    .join(', ') || '-';
}

function renderVolumes(volumes) {
  const rows = volumes.map((v) => el('tr', {
    class: 'selectable' + (v.name === state.selected ? ' selected' : '') + (v.state === 'healthy' ? '' : ' degraded'),
    'data-volume': v.name,
    onclick: () => { state.selected = v.name; refreshObject(); renderVolumes(volumes); },
  },
  el('td', {}, el('strong', {}, v.name)), cell(bytes(v.size_bytes), true), cell(v.policy), el('td', {}, badge(v.state)),
  cell(v.owner || '-'), cell(v.epoch === null || v.epoch === undefined ? '-' : v.epoch, true), cell(v.open_by, true),
  cell(bytes(v.used_bytes), true),
  cell(v.fill ? `filling from ${v.fill.from}: ${Math.floor(100 * v.fill.done_bytes / Math.max(1, v.fill.done_bytes + v.fill.left_bytes))}%` : ''),
  ));
  if (!volumes.length) rows.push(el('tr', {}, el('td', { colSpan: 9 }, 'No volumes yet: tessera volume create NAME --size 10G')));
  table('volumes', ['Name', { title: 'Size', num: true }, 'Policy', 'State', 'Owner', { title: 'Epoch', num: true },
    { title: 'Clients', num: true }, { title: 'Written', num: true }, ''], rows);
  const select = $('chart-scope');
  const chosen = select.value;
  select.replaceChildren(el('option', { value: '' }, 'every host'),
    ...volumes.map((v) => el('option', { value: v.name }, 'volume ' + v.name)));
  select.value = volumes.some((v) => v.name === chosen) ? chosen : '';
  if (state.selected && !volumes.some((v) => v.name === state.selected)) {
    state.selected = null;
    $('object').replaceChildren();
  }
}

async function refreshObject() {
  if (!state.selected) return;
  const name = state.selected;
  const o = await api('/v1/objects/' + encodeURIComponent(name));
  if (state.selected !== name) return;
  const columns = new Map();
  const witnesses = [];
  for (const c of o.components) {
    if (c.role === 'witness') { witnesses.push(c); continue; }
    if (!columns.has(c.column)) columns.set(c.column, []);
    columns.get(c.column).push(c);
  }
  const component = (c) => el('li', { class: 'component', 'data-component': c.id },
    `${c.role} ${c.id} on ${c.host} / ${c.disk_group} `, badge(c.state),
    c.role === 'witness' ? '' : ` ${bytes(c.allocated_bytes)} written`,
    c.dirty_bytes ? `, ${bytes(c.dirty_bytes)} to resync` : '');
  const tree = el('ul', { class: 'tree' }, el('li', {},
    `${o.volume} (${bytes(o.size_bytes)}, policy ${o.policy}, layout generation ${o.generation}, owner ${o.owner || '-'} at epoch ${o.epoch === null ? '-' : o.epoch}) `, badge(o.state),
    el('ul', {},
      [...columns.entries()].sort((a, b) => a[0] - b[0]).map(([column, copies]) => el('li', {},
        `RAID-1 mirror, stripe column ${column}`, el('ul', {}, copies.map(component)))),
      witnesses.length ? el('li', {}, 'witnesses', el('ul', {}, witnesses.map(component))) : null,
    )));
  $('object').replaceChildren(el('h3', {}, 'Component tree of ' + o.volume), tree,
    el('p', { class: 'note' }, `Read cache: ${count(o.read_cache.hits)} blocks hit, ${count(o.read_cache.misses)} missed.`));
}

// A progress bar's filled part (a style set through the DOM, which the
// page's content security policy allows, unlike style attributes).
function filled(pct) {
  const part = el('div');
  part.style.width = pct + '%';
  return part;
}

function renderResyncs(resyncs) {
  const rows = resyncs.map((r) => {
    const total = r.done_bytes + r.left_bytes;
    const pct = total ? Math.floor(100 * r.done_bytes / total) : 100;
    return el('tr', { 'data-component': r.component },
      cell(r.volume), cell(r.component), cell(r.host), cell(r.kind), el('td', {}, badge(r.state)),
      el('td', {}, el('span', { class: 'bar' }, filled(pct)), ` ${pct}%`),
      cell(bytes(r.copied_bytes), true), cell(bytes(r.rate_bytes_per_s) + '/s', true), cell(seconds(r.eta_s), true),
      cell(r.attempts, true), cell(r.error || ''));
  });
  if (!resyncs.length) rows.push(el('tr', {}, el('td', { colSpan: 11 }, 'Every copy is up to date: no resync or rebuild has run recently.')));
  table('resyncs', ['Volume', 'Component', 'Host', 'Kind', 'State', 'Progress', { title: 'Copied', num: true },
    { title: 'Rate', num: true }, { title: 'ETA', num: true }, { title: 'Attempts', num: true }, 'Last error'], rows);
}

// --- VAAI counters (GET /v1/activity) ---

function renderOffloads(activity) {
  const rows = activity.map((a) => {
    const o = a.offloads;
    return el('tr', { 'data-volume': a.volume },
      cell(a.volume), cell(a.owner), cell(count(o.ats), true), cell(count(o.ats_miscompare), true),
      cell(count(o.clone_commands), true), cell(count(o.clone_read_blocks), true), cell(count(o.clone_write_blocks), true),
      cell(bytes(o.clone_shared_bytes), true), cell(count(o.zero_blocks), true), cell(count(o.delete_blocks), true),
      cell(count(o.out_of_space), true));
  });
  if (!activity.length) rows.push(el('tr', {}, el('td', { colSpan: 11 }, 'No volume has an owner on the hosts this API serves.')));
  table('vaai', ['Volume', 'Owner', { title: 'ATS', num: true }, { title: 'ATS miscompares', num: true },
    { title: 'XCOPY commands', num: true }, { title: 'XCOPY blocks read', num: true }, { title: 'XCOPY blocks written', num: true },
    { title: 'Shared, not copied', num: true }, { title: 'WRITE SAME zero blocks', num: true },
    { title: 'UNMAP blocks', num: true }, { title: 'Out of space', num: true }], rows);
}

// --- Events (GET /v1/events) ---

function renderEvents(events) {
  const rows = events.slice().reverse().map((e) => el('tr', { 'data-code': e.code },
    cell(clock(e.at_ms)), el('td', {}, el('code', {}, e.code)), cell(e.host || ''), cell(e.subject), cell(e.message), cell(e.by || '')));
  if (!events.length) rows.push(el('tr', {}, el('td', { colSpan: 6 }, 'Nothing has happened yet.')));
  table('events', ['Time', 'Code', 'Host', 'Subject', 'What happened', 'By'], rows);
}

// --- Charts (GET /v1/activity/history) ---

function addHistory(view) {
  $('sample-interval').textContent = view.sample_interval_s;
  for (const i of view.intervals) {
    if (i.end_ms > state.lastEndMs) {
      state.intervals.push(i);
      state.lastEndMs = i.end_ms;
    }
  }
  const oldest = state.lastEndMs - HOUR_MS;
  while (state.intervals.length && state.intervals[0].end_ms <= oldest) state.intervals.shift();
}

function meanLatency(r) {
  const ops = r.read_iops + r.write_iops;
  return ops > 0 ? (r.read_latency_us * r.read_iops + r.write_latency_us * r.write_iops) / ops : null;
}

// The series of one chart: per host (every host, zero where it owned
// nothing busy), or a volume's reads and writes.
function series(metric) {
  const scope = $('chart-scope').value;
  const pick = {
    iops: [(r) => r.read_iops + r.write_iops, (r) => r.read_iops, (r) => r.write_iops],
    mbs: [(r) => r.read_mib_s + r.write_mib_s, (r) => r.read_mib_s, (r) => r.write_mib_s],
    latency: [meanLatency, (r) => (r.read_iops > 0 ? r.read_latency_us : null), (r) => (r.write_iops > 0 ? r.write_latency_us : null)],
  }[metric];
  const idle = metric === 'latency' ? null : 0;
  const points = (find, value) => state.intervals.map((i) => {
    const r = i.rates.find(find);
    return [i.end_ms, r ? value(r) : idle];
  });
  if (!scope) {
    return state.hosts.map((h, k) => ({
      name: h, color: COLORS[k % COLORS.length],
      points: points((r) => r.kind === 'host' && r.name === h, pick[0]),
    }));
  }
  const mine = (r) => r.kind === 'volume' && r.name === scope;
  return [
    { name: scope + ' read', color: COLORS[0], points: points(mine, pick[1]) },
    { name: scope + ' write', color: COLORS[1], points: points(mine, pick[2]) },
  ];
}

function niceCeiling(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function drawChart(canvas, lines) {
  const ctx = canvas.getContext('2d');
  const w = canvas.width;
  const h = canvas.height;
  const left = 52;
  const right = 18;
  const top = 22;
  const bottom = 20;
  ctx.clearRect(0, 0, w, h);
  ctx.font = '11px system-ui, sans-serif';
  const end = state.lastEndMs || Date.now();
  const minutes = Number($('chart-window').value);
  const span = minutes * MINUTE_MS;
  const start = end - span;
  const shown = (t) => t > start;
  let max = 0;
  for (const l of lines) for (const [t, v] of l.points) if (shown(t) && v !== null && v > max) max = v;
  const ceil = niceCeiling(max);
  const x = (t) => left + (w - left - right) * (t - start) / span;
  const y = (v) => h - bottom - (h - top - bottom) * v / ceil;
  ctx.strokeStyle = '#e3e6ea';
  ctx.fillStyle = '#5f6b76';
  ctx.textAlign = 'right';
  for (let k = 0; k <= 4; k += 1) {
    const v = ceil * k / 4;
    ctx.beginPath(); ctx.moveTo(left, y(v)); ctx.lineTo(w - right, y(v)); ctx.stroke();
    ctx.fillText(v >= 100 ? Math.round(v).toLocaleString('en-US') : String(+v.toFixed(2)), left - 4, y(v) + 4);
  }
  ctx.textAlign = 'center';
  const ticks = { 5: 5, 15: 3, 60: 4 }[minutes] || 4;
  for (let k = ticks; k >= 0; k -= 1) {
    const m = minutes * k / ticks;
    ctx.fillText(m ? `-${m} min` : 'now', x(end - m * MINUTE_MS), h - 5);
  }
  let latest = 0;
  ctx.textAlign = 'left';
  let legendX = left;
  for (const l of lines) {
    ctx.strokeStyle = l.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let drawing = false;
    for (const [t, v] of l.points) {
      if (v === null || !shown(t)) { drawing = false; continue; }
      if (drawing) ctx.lineTo(x(t), y(v)); else ctx.moveTo(x(t), y(v));
      drawing = true;
    }
    ctx.stroke();
    // Dots too, so a lone interval (the first, or one between idle ones)
    // shows.
    ctx.fillStyle = l.color;
    for (const [t, v] of l.points) {
      if (v !== null && shown(t)) ctx.fillRect(x(t) - 1.5, y(v) - 1.5, 3, 3);
    }
    ctx.lineWidth = 1;
    const last = l.points.length ? l.points[l.points.length - 1][1] : null;
    if (last !== null) latest += last;
    ctx.fillStyle = l.color;
    ctx.fillRect(legendX, 6, 10, 10);
    ctx.fillStyle = '#1b1f23';
    ctx.fillText(l.name, legendX + 14, 15);
    legendX += 22 + ctx.measureText(l.name).width;
  }
  // What the chart shows now, for whoever reads the page without eyes.
  canvas.dataset.latest = String(latest);
  canvas.dataset.peak = String(max);
  canvas.dataset.points = String(state.intervals.length);
  canvas.setAttribute('aria-label', `${lines.map((l) => l.name).join(', ')}: latest ${latest.toFixed(1)}, peak ${max.toFixed(1)}`);
}

function drawCharts() {
  drawChart($('chart-iops'), series('iops'));
  drawChart($('chart-mbs'), series('mbs'));
  drawChart($('chart-latency'), series('latency'));
}

// --- Refresh loop and sign-in ---

async function refresh() {
  try {
    const [status, activity, hostActivity, history, events] = await Promise.all([
      api('/v1/status'),
      api('/v1/activity'),
      api('/v1/activity/hosts'),
      api('/v1/activity/history' + (state.lastEndMs ? '?after_ms=' + state.lastEndMs : '')),
      api('/v1/events?limit=30'),
    ]);
    state.peers = new Map(hostActivity.map((h) => [h.host, h.peers]));
    renderStatus(status);
    renderOffloads(activity);
    addHistory(history);
    drawCharts();
    renderEvents(events);
    await refreshObject();
    $('fetch-error').hidden = true;
    $('updated').textContent = 'updated ' + clock(Date.now());
    document.body.dataset.refreshed = String(Date.now());
  } catch (e) {
    if (e instanceof Unauthorized) {
      signOut(e.message);
      return;
    }
    $('fetch-error').textContent = 'Cannot read the cluster: ' + e.message;
    $('fetch-error').hidden = false;
  }
  state.timer = setTimeout(refresh, REFRESH_MS);
}

function signOut(why) {
  clearTimeout(state.timer);
  sessionStorage.removeItem(TOKEN_KEY);
  state.intervals = [];
  state.lastEndMs = 0;
  $('main').hidden = true;
  $('sign-out').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = why || '';
}

function signedIn() {
  $('login').hidden = true;
  $('main').hidden = false;
  $('sign-out').hidden = false;
  refresh();
}

$('login-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const token = $('token').value.trim();
  if (!token) {
    $('login-error').textContent = 'Paste a token first.';
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token').value = '';
  signedIn();
});
$('sign-out').addEventListener('click', () => signOut(''));
$('chart-scope').addEventListener('change', drawCharts);
$('chart-window').addEventListener('change', drawCharts);

if (sessionStorage.getItem(TOKEN_KEY)) signedIn(); else signOut('');
