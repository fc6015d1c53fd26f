// fpmbus status page: polls /status.json with the page's own query (filter, state, sort, page) and
// renders the same markup as the server (page.html), so that a reload and a poll look alike. No
// outside assets. The page works without this script: it then shows the state at load time.
(function () {
  "use strict";
  var every = 2000;
  var userOpen = {}; // worker -> open, as the user toggled it
  var updates = 0;
  var timer = null;

  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (attrs[k] === null || attrs[k] === undefined || attrs[k] === false) continue;
        if (k === "text") e.textContent = attrs[k];
        else if (k === "cls") e.className = attrs[k];
        else e.setAttribute(k, attrs[k] === true ? "" : attrs[k]);
      }
    }
    for (var i = 2; i < arguments.length; i++) add(e, arguments[i]);
    return e;
  }
  function add(e, c) {
    if (c === null || c === undefined || c === false) return;
    if (Array.isArray(c)) { c.forEach(function (x) { add(e, x); }); return; }
    e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  function td(v, cls, attrs) { // the class first, as the server renders it
    var a = { cls: cls };
    for (var k in attrs || {}) a[k] = attrs[k];
    return el("td", a, v);
  }
  function num(f) {
    f = +f || 0;
    if (f >= 1e9) return (f / 1e9).toFixed(2) + "G";
    if (f >= 1e6) return (f / 1e6).toFixed(2) + "M";
    if (f >= 1e4) return (f / 1e3).toFixed(1) + "k";
    return f === Math.trunc(f) ? String(f) : f.toFixed(1);
  }
  function rate(f) { f = +f || 0; if (f === 0) return "0/s"; return (f < 10 ? f.toFixed(1) : num(Math.round(f))) + "/s"; }
  function secs(f) {
    f = +f || 0;
    if (f === 0) return "–";
    if (f < 0.001) return (f * 1e6).toFixed(0) + " µs";
    if (f < 1) return (f * 1e3).toFixed(1) + " ms";
    return f.toFixed(2) + " s";
  }
  function bytes(f) {
    if (f < 0) return "unlimited";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    for (var i = 0; i < units.length; i++) {
      if (f < 1024 || i === units.length - 1) return i === 0 ? f.toFixed(0) + " B" : f.toFixed(1) + " " + units[i];
      f /= 1024;
    }
  }
  function age(s) { // as Go's time.Duration prints whole seconds
    if (!(s > 0)) return "unlimited";
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
    var xs = (x === Math.trunc(x) ? x : x.toFixed(3)) + "s";
    return h ? h + "h" + m + "m" + xs : m ? m + "m" + xs : xs;
  }
  function ago(t, now) {
    if (!t || t.indexOf("0001-") === 0) return "never";
    var d = (Date.parse(now) - Date.parse(t)) / 1000;
    if (d < 1) return "now";
    if (d < 60) return Math.floor(d) + "s ago";
    if (d < 3600) return Math.floor(d / 60) + "m ago";
    if (d < 48 * 3600) return Math.floor(d / 3600) + "h ago";
    return t.slice(0, 16).replace("T", " ");
  }
  function pairs(m, sep) {
    var out = [];
    Object.keys(m || {}).sort().forEach(function (k) { out.push(k + (sep || " ") + num(m[k]) + " "); });
    return out.join("");
  }
  function query() { return new URLSearchParams(location.search); }
  function withQuery(mut) { var q = query(); mut(q); var s = q.toString(); return s ? "?" + s : "?"; }
  function sortURL(q, col) {
    return withQuery(function (p) {
      p.delete("offset");
      if (q.sort === col) { if (q.desc) p.delete("desc"); else p.set("desc", "1"); } else {
        if (col === "key") p.delete("sort"); else p.set("sort", col);
        if (col !== "key") p.set("desc", "1"); else p.delete("desc");
      }
    });
  }
  function sortMark(q, col) { return q.sort !== col ? "" : q.desc ? " ▾" : " ▴"; }

  function table(head, rows, attrs) {
    return el("table", attrs || null, el("thead", null, el("tr", null, head.map(function (h) { return el("th", null, h); }))),
      el("tbody", null, rows));
  }

  function summary(p) {
    var s = p.summary;
    return el("section", { id: "summary", cls: "summary" },
      p.error ? el("p", { cls: "error", id: "publishers-error" }, "publishers: " + p.error) : null,
      el("span", { id: "sum-total" }, s.total), " publishers: ",
      el("span", { id: "sum-flowing", cls: "ok" }, s.flowing + " flowing"), ", ",
      el("a", { id: "sum-gaps", cls: s.with_gaps ? "warn" : "", href: "?state=gaps&sort=missing&desc=1" }, s.with_gaps + " with gaps"), ", ",
      el("a", { id: "sum-stale", cls: s.stale ? "bad" : "", href: "?state=stale" }, s.stale + " stale"), ", ",
      el("span", { id: "sum-restarted" }, s.restarted + " restarted"), "; ",
      el("span", { id: "sum-missing" }, num(s.missing) + " FPMs missing"),
      " (", p.causes.map(function (c, i) { return [i ? ", " : "", c + " ", el("span", { "data-cause": c }, num((p.missing_by_cause || {})[c] || 0))]; }), "); ",
      el("span", { id: "sum-rate" }, rate(s.rate)));
  }

  function components(st) {
    return el("section", { id: "components" }, el("h2", null, "Components"),
      table(["component", "state", "since", "restarts", "reason / last error"], (st.components || []).map(function (c) {
        return el("tr", { "data-component": c.name, "data-state": c.state }, td(c.name), td(el("span", { cls: "state " + c.state }, c.state)),
          td(ago(c.since, st.time)), td(c.restarts, "n"),
          td(c.reason ? c.reason : c.last_error ? el("span", { cls: "dim" }, "last error: " + c.last_error) : "", "reason"));
      })));
  }

  function durability(d) {
    if (!d) return null;
    var sync = d.sync ? ["Server fsync: ", el("b", { id: "sync" }, d.sync === "always" ? "always (before every ack)" : "every " + d.sync + " (a power cut loses what was acknowledged since)"), "."]
      : ["Server fsync: the server's ", el("code", null, "sync_interval"), " (not visible to a client)."];
    return el("section", { id: "durability" }, el("h2", null, "Durability"), el("p", null, sync, " ", d.error ? el("span", { cls: "error" }, d.error) : null),
      d.streams && d.streams.length ? table(["stream", "storage", "replicas", "max bytes", "max age", "discard", "dedup window", "messages", "size"], d.streams.map(function (s) {
        return el("tr", { "data-stream": s.name }, td(s.name), td(s.storage), td(s.replicas, "n"), td(bytes(s.max_bytes), "n"), td(age(s.max_age_seconds), "n"),
          td(s.discard), td(age(s.duplicates_seconds), "n"), td(num(s.messages), "n"), td(bytes(s.bytes), "n"));
      })) : null);
  }

  function store(s) {
    if (!s) return null;
    return el("section", { id: "store" }, el("h2", null, "Store"), el("p", null,
      el("span", { cls: "state " + (s.ok ? "ready" : "degraded") }, s.ok ? "takes writes" : "refuses writes"),
      " free ", el("b", { id: "store-free" }, bytes(s.free_bytes)), "; recoveries " + num(s.recoveries) + "; faults " + pairs(s.faults)));
  }

  function kv(id, label, value, cls) { return el("div", null, el("dt", null, label), el("dd", { id: id, cls: cls || null }, value)); }

  function bridge(b) {
    if (!b) return null;
    var dropped = (b.dropped.buffer_full || 0) + (b.dropped.shutdown || 0);
    return el("section", { id: "bridge" }, el("h2", null, "Bridge"), el("dl", { cls: "grid" },
      kv("bridge-ranks", "ranks", b.ranks),
      kv("bridge-received", "received", [num(b.received) + " ", el("small", null, rate(b.received_per_second))]),
      kv("bridge-published", "published", [num(b.published) + " ", el("small", null, rate(b.published_per_second))]),
      kv("bridge-buffer", "buffer", [num(b.buffered) + (b.max_buffer ? " / " + num(b.max_buffer) : "") + " ", el("small", null, "high " + num(b.buffered_high))]),
      kv("bridge-inflight", "in flight", num(b.in_flight) + (b.max_in_flight ? " / " + num(b.max_in_flight) : "")),
      kv("bridge-latency", "publish latency", "p50 " + secs(b.publish_latency_seconds.p50) + " · p99 " + secs(b.publish_latency_seconds.p99)),
      kv("bridge-dropped", "dropped", pairs(b.dropped), dropped ? "warn" : ""),
      kv("bridge-invalid", "invalid", pairs(b.invalid)),
      kv("bridge-deadletters", "dead letters", [num(b.dead_letters), b.dead_letters_lost ? [" ", el("span", { cls: "bad" }, b.dead_letters_lost + " lost")] : null]),
      kv("bridge-markers", "drop markers", num(b.drop_markers)),
      kv("bridge-lostafterack", "lost after ack", num(b.lost_after_ack), b.lost_after_ack ? "bad" : ""),
      kv("bridge-batches", "batches", [num(b.batches), b.batches_failed ? [" ", el("small", null, b.batches_failed + " failed")] : null])),
      b.lossy_ranks && b.lossy_ranks.length ? table(["rank", "received", "published", "dropped", "invalid", "dead letters"], b.lossy_ranks.map(function (r) {
        return el("tr", { "data-rank": r.rank }, td(r.rank), td(num(r.received), "n"), td(num(r.published), "n"), td(num(r.dropped), "n"), td(num(r.invalid), "n"), td(num(r.dead_letters), "n"));
      }), { id: "bridge-ranks-lossy" }) : null);
  }

  function consumers(cs) {
    if (!cs || !cs.length) return null;
    return el("section", { id: "consumers" }, el("h2", null, "Consumers"),
      table(["consumer", "component", "lag", "acked", "ack rate", "redelivered", "dead letters", "retention lost", "restarts", "handle p99"], cs.map(function (c) {
        return el("tr", { "data-consumer": c.name }, td(c.name), td(c.component || ""), td(num(c.lag), "n"), td(num(c.acked), "n"), td(rate(c.acked_per_second), "n"),
          td(num(c.redelivered), "n"), td(num(c.dead_letters), "n" + (c.dead_letters ? " warn" : "")), td(num(c.retention_lost), "n" + (c.retention_lost ? " bad" : "")),
          td(c.restarts, "n"), td(secs(c.handle_p99_seconds), "n"));
      })));
  }

  function jetstream(j) {
    if (!j) return null;
    return el("section", { id: "jetstream" }, el("h2", null, "JetStream consumers"), j.error ? el("p", { cls: "error" }, j.error) : null,
      table(["stream", "consumer", "component", "pending", "ack pending", "redelivered", "waiting pulls"], (j.consumers || []).map(function (c) {
        var full = c.max_ack_pending && c.ack_pending >= c.max_ack_pending;
        return el("tr", { "data-stream": c.stream, "data-name": c.name }, td(c.stream), td(c.name), td(c.component || ""), td(num(c.pending), "n"),
          td(num(c.ack_pending) + " / " + num(c.max_ack_pending), "n" + (full ? " bad" : "")), td(num(c.redelivered), "n"), td(c.waiting, "n"));
      })));
  }

  function bench(st) {
    var m = st.merge, s = st.seal, p = st.predict;
    if (!m && !s && !p) return null;
    return el("section", { id: "bench" }, el("h2", null, "Benchmarks, datasets, predictions"), el("dl", { cls: "grid" },
      m ? kv("merge-runs", "merged runs", pairs(m.runs)) : null,
      s ? [kv("seal-runs", "sealed runs", pairs(s.runs)), kv("seal-cells", "cells", pairs(s.cells)),
        kv("seal-audit", "audit", "missing " + num(s.cells_missing) + " · replaced " + num(s.cells_replaced) + " · tampered " + num(s.tampered_cells) + (s.bucket_unprotected ? " · bucket unprotected" : ""),
          s.cells_missing || s.tampered_cells || s.bucket_unprotected ? "bad" : "")] : null,
      p ? [kv("predict-answers", "predictions", [pairs(p.answers), el("small", null, rate(p.answers_per_second))]), kv("predict-errors", "predict errors", pairs(p.errors, ": ")),
        kv("predict-cells", "cells served", [num(p.cells) + " ", el("small", null, "revision " + num(p.revision) + ", " + num(p.queued) + " queued")])] : null));
  }

  function cols(causes) {
    return el("colgroup", null, el("col", { cls: "c-key" }), el("col", { cls: "c-state" }), [1, 2, 3, 4, 5].map(function () { return el("col", { cls: "c-n" }); }),
      causes.map(function () { return el("col", { cls: "c-n" }); }));
  }

  function isOpen(g, shown) { return shown <= 4 || g.with_gaps > 0 || g.stale > 0 || g.flowing < g.ranks; }

  function publishers(p, now, form) {
    var q = p.query;
    q.offset = q.offset || 0; // omitted when 0
    var heads = [["key", "rank"], ["state", "state"], ["rate", "rate"], ["last_seen", "last seen"], ["messages", "FPMs"], ["gaps", "gaps"], ["missing", "missing"]]
      .concat(p.causes.map(function (c) { return [c, c]; }));
    var matched = document.getElementById("matched");
    if (matched) {
      matched.textContent = p.matched + " match, in " + p.group_count + " workers" +
        (p.shown < p.group_count ? "; showing " + (q.offset + 1) + "–" + (q.offset + p.shown) : "");
    }
    var groups = p.groups.map(function (g) {
      var w = g.namespace + "/" + g.component + "/" + g.worker_id;
      var open = w in userOpen ? userOpen[w] : isOpen(g, p.shown);
      var d = el("details", { cls: "group", "data-worker": w, open: open },
        el("summary", null, el("span", { cls: "worker" }, g.namespace + "/" + g.component + "/", el("b", null, g.worker_id)),
          el("span", { cls: "gsum" }, g.ranks + " ranks · " + g.flowing + " flowing", g.with_gaps ? [" · ", el("span", { cls: "warn" }, g.with_gaps + " with gaps")] : null,
            g.stale ? [" · ", el("span", { cls: "bad" }, g.stale + " stale")] : null, " · " + num(g.missing) + " missing · " + rate(g.rate))),
        el("table", { cls: "pubs" }, cols(p.causes), el("tbody", null, g.rows.map(function (r) {
          return el("tr", { cls: "pub", "data-key": r.namespace + "/" + r.component + "/" + r.worker_id + "/" + r.dp_rank, "data-state": r.state,
            "data-flowing": String(r.flowing), "data-gaps": r.gaps_total, "data-missing": r.missing_total },
            td("rank " + r.dp_rank), td([el("span", { cls: "state " + r.state }, r.state), r.pending_gaps ? [" ", el("small", null, r.pending_gaps + " pending")] : null]),
            td(rate(r.rate), "n"), td(ago(r.last_seen, now), "n"), td(num(r.messages), "n"), td(num(r.gaps_total), "n" + (r.gaps_total ? " warn" : "")),
            td(num(r.missing_total), "n" + (r.missing_total ? " warn" : "")),
            p.causes.map(function (c) { return td(num((r.missing || {})[c] || 0), "n", { "data-cause": c }); }));
        }))));
      d.addEventListener("toggle", function () { userOpen[w] = d.open; });
      return d;
    });
    if (!groups.length) groups = [el("p", { cls: "dim", id: "no-publishers" }, p.summary.total ? "No publisher matches." : "No publisher seen yet.")];
    var nav = null;
    if (p.shown < p.group_count) {
      nav = el("nav", { id: "pages" }, q.offset > 0 ? [el("a", { href: withQuery(function (x) { x.delete("offset"); }), "data-offset": "0" }, "first"), " "] : null,
        q.offset + p.shown < p.group_count ? el("a", { id: "next", href: withQuery(function (x) { x.set("offset", q.offset + p.shown); }), "data-offset": q.offset + p.shown }, "next " + q.limit + " workers") : null);
    }
    return el("section", { id: "publishers" }, el("h2", null, "Publishers ", el("small", null, "gap detector group " + p.group)), form,
      el("table", { cls: "pubs head" }, cols(p.causes), el("thead", null, el("tr", null, heads.map(function (h) {
        return el("th", null, el("a", { "data-sort": h[0], href: sortURL(q, h[0]) }, h[1] + sortMark(q, h[0])));
      })))),
      el("div", { id: "groups" }, groups), nav);
  }

  function render(st) {
    var form = document.getElementById("filter");
    var main = document.getElementById("status");
    var parts = [];
    if (st.publishers) parts.push(summary(st.publishers));
    parts.push(components(st), bridge(st.bridge), consumers(st.consumers), jetstream(st.jetstream), bench(st), durability(st.durability), store(st.store));
    if (st.publishers) parts.push(publishers(st.publishers, st.time, form || el("form", { id: "filter" })));
    var frag = document.createDocumentFragment();
    add(frag, parts);
    main.replaceChildren(frag);
    document.body.dataset.health = st.health;
    document.body.dataset.render = "script";
    document.body.dataset.updates = String(++updates);
    var h = document.getElementById("health");
    h.textContent = st.health;
    h.className = "badge " + st.health;
    var up = document.getElementById("updated");
    up.dataset.time = st.time;
    up.textContent = "live, updated " + st.time.slice(11, 19) + " UTC";
    document.title = "fpmbus " + st.process + ": " + st.health;
  }

  function refresh() {
    clearTimeout(timer);
    var began = Date.now();
    fetch("/status.json" + location.search, { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error("status.json: HTTP " + r.status);
      return r.json();
    }).then(render).catch(function (err) {
      var up = document.getElementById("updated");
      up.textContent = "not updated: " + err.message;
      up.className = "error";
    }).then(function () {
      // A status that takes long to build (thousands of ranks, a loaded host) is asked for less often.
      timer = setTimeout(refresh, Math.max(every, 10 * (Date.now() - began)));
    });
  }

  function navigate(href) {
    history.replaceState(null, "", href);
    refresh();
  }

  document.addEventListener("click", function (e) {
    var a = e.target.closest && e.target.closest("a[data-sort], #pages a, #sum-gaps, #sum-stale");
    if (!a) return;
    e.preventDefault();
    navigate(a.getAttribute("href"));
  });

  var debounce = null;
  function fromForm(form) {
    var p = query();
    ["q", "state"].forEach(function (n) {
      var v = form.elements[n] ? form.elements[n].value.trim() : "";
      if (v) p.set(n, v); else p.delete(n);
    });
    p.delete("offset");
    var s = p.toString();
    return s ? "?" + s : location.pathname;
  }
  document.addEventListener("input", function (e) {
    var form = e.target.form;
    if (!form || form.id !== "filter") return;
    clearTimeout(debounce);
    debounce = setTimeout(function () { navigate(fromForm(form)); }, 250);
  });
  document.addEventListener("submit", function (e) {
    if (e.target.id !== "filter") return;
    e.preventDefault();
    navigate(fromForm(e.target));
  });
  document.addEventListener("DOMContentLoaded", refresh);
  if (document.readyState !== "loading") refresh();
})();
