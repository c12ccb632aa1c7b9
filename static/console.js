// The live layer: a websocket follows the journal from the page's cursor; each event is appended
// to the timeline (as text, never HTML) and the page's server-rendered fragments are re-fetched.
// Pushes are hints: on reconnect the socket resumes after the last event seen, so nothing is
// missed and nothing is shown twice.
(function () {
  "use strict";

  var LABELS = {
    live: "live",
    connecting: "connecting…",
    offline: "offline",
    "signed-out": "signed out: reload to log in",
    refused: "not allowed"
  };
  var stopped = false;  // the server refused us for good: no more sockets, no more fetches

  function setStatus(state) {
    var el = document.getElementById("live-status");
    if (!el) return;
    // Hidden until the page follows something (data-live): a page that is not live has no
    // connection to be offline from.
    el.hidden = false;
    el.dataset.state = state;
    el.textContent = LABELS[state] || state;
  }

  function stop(state) {
    stopped = true;
    setStatus(state);
  }

  // What a person is in the middle of (a ticked checkbox, a half-typed reason, an open editor)
  // survives a live refresh: controls marked data-keep keep their state by that key.
  function replaceKeeping(el, html) {
    var kept = {};
    var focused = document.activeElement && el.contains(document.activeElement)
      ? document.activeElement.getAttribute("data-keep") : null;
    el.querySelectorAll("[data-keep]").forEach(function (c) {
      var key = c.getAttribute("data-keep");
      var details = c.closest("details");
      kept[key] = { checked: c.checked, value: c.value, open: details ? details.open : null };
    });
    el.innerHTML = html;
    el.querySelectorAll("[data-keep]").forEach(function (c) {
      var state = kept[c.getAttribute("data-keep")];
      if (!state) return;
      if (c.type === "checkbox") c.checked = state.checked; else c.value = state.value;
      var details = c.closest("details");
      if (details && state.open) details.open = true;
      if (focused && c.getAttribute("data-keep") === focused) c.focus();
    });
    // Page scripts that hold state about the replaced content (static/inbox.js) pick it up.
    el.dispatchEvent(new CustomEvent("console:replaced", { bubbles: true }));
  }

  var REFRESH_GAP_MS = 300;
  var pending = {};
  function refresh(ids) {
    if (stopped) return;
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) return;
      if (pending[id]) { pending[id] = "again"; return; }
      pending[id] = true;
      fetch(el.dataset.fragment, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) {
          // A fragment that came back as the login page (session ended) is not put in the page.
          if (r.redirected || r.status === 401) { stop("signed-out"); return null; }
          if (r.status === 403) { stop("refused"); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) { if (html !== null) replaceKeeping(el, html); })
        .catch(function () { /* unreachable server: reconnecting refetches */ })
        .finally(function () {
          // Events that came in meanwhile are folded into one more fetch, after a short gap:
          // a busy journal must not turn every open page into a tight loop of page renders.
          if (pending[id] === "again") {
            setTimeout(function () { pending[id] = false; refresh([id]); }, REFRESH_GAP_MS);
          } else {
            pending[id] = false;
          }
        });
    });
  }

  function connect(path, cursorRef, onMessage, fragmentIds) {
    var delay = 500;
    var opened = false;
    function open() {
      if (stopped) return;
      setStatus("connecting");
      var scheme = location.protocol === "https:" ? "wss://" : "ws://";
      var ws = new WebSocket(scheme + location.host + path + "?after=" + cursorRef());
      ws.onopen = function () {
        delay = 500;
        setStatus("live");
        // What the fragments show may have changed while the socket was down.
        if (opened) refresh(fragmentIds);
        opened = true;
      };
      ws.onmessage = function (m) { onMessage(JSON.parse(m.data)); };
      ws.onclose = function (ev) {
        // Refused (4401 logged out, 4403 no role, 4404 gone): retrying cannot help.
        if (ev.code === 4401) { stop("signed-out"); return; }
        if (ev.code >= 4400 && ev.code < 4500) { stop("refused"); return; }
        if (stopped) return;
        setStatus("offline");
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 10000);
      };
    }
    open();
  }

  // The live twin of the server's |visible filter (runtime/text.py: categories Cc, Cf, Zl, Zp;
  // line breaks kept): each such character shows as a marked <U+XXXX> instead of acting.
  var HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u;
  function visibleText(el, text) {
    Array.from(String(text)).forEach(function (ch) {
      if (ch === "\n" || !HIDDEN.test(ch)) { el.append(ch); return; }
      var label = "U+" + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
      var m = document.createElement("span"); m.className = "hidden-char"; m.title = label;
      m.textContent = "<" + label + ">"; el.append(m);
    });
  }

  // A span between two events, as console/web/formats.elapsed says it.
  function elapsed(seconds) {
    seconds = Math.max(0, seconds);
    if (seconds < 10) return seconds.toFixed(1) + "s";
    var s = Math.floor(seconds);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d " + Math.floor(s % 86400 / 3600) + "h";
  }

  function timelineItem(e, timeline) {
    var li = document.createElement("li");
    li.dataset.seq = e.id;
    li.dataset.at = e.at || "";
    var seq = document.createElement("span"); seq.className = "mono seq"; seq.textContent = "#" + e.id;
    var t = document.createElement("time"); t.dateTime = e.at; t.title = e.at;
    t.textContent = String(e.at || "").slice(0, 19).replace("T", " ") + " UTC";
    var ty = document.createElement("strong"); ty.className = "etype"; ty.textContent = e.type;
    li.append(seq, " ", t, " ", ty);
    if (e.operation) {
      var op = document.createElement("a"); op.className = "mono"; op.href = "/operations/" + encodeURIComponent(e.operation) + "/"; op.textContent = e.operation; li.append(" ", op);
      // The operation's step and the time since its previous event, as the server renders them.
      var earlier = null;
      (timeline ? timeline.querySelectorAll("li[data-op]") : []).forEach(function (x) { if (x.dataset.op === e.operation) earlier = x; });
      var row = document.querySelector('tr[data-operation="' + CSS.escape(e.operation) + '"] td:nth-child(2)');
      var step = (e.data && e.data.step) || (earlier && earlier.dataset.step) || (row ? row.textContent : "");
      li.dataset.op = e.operation; li.dataset.step = step;
      if (step) { var st = document.createElement("span"); st.className = "step"; visibleText(st, step); li.append(" ", st); }
      if (earlier && earlier.dataset.at && e.at) {
        var gap = (Date.parse(e.at) - Date.parse(earlier.dataset.at)) / 1000;
        if (!isNaN(gap)) { var af = document.createElement("span"); af.className = "muted after"; af.title = "after this operation's previous event"; af.textContent = "+" + elapsed(gap); li.append(" ", af); }
      }
    }
    if (e.actor) { var a = document.createElement("span"); a.className = "muted"; visibleText(a, "by " + e.actor); li.append(" ", a); }
    if (e.data && e.data.to) { var b = document.createElement("span"); b.className = "badge st-" + e.data.to; b.textContent = e.data.to; li.append(" → ", b); }
    if (e.data && e.data.reason) { var r = document.createElement("span"); r.className = "muted"; visibleText(r, e.data.reason); li.append(" ", r); }
    return li;
  }

  // Time left on a request ticks down in place (the server renders the first value).
  function tickTimeLeft() {
    document.querySelectorAll("time.time-left[datetime]").forEach(function (t) {
      var left = Math.floor((Date.parse(t.getAttribute("datetime")) - Date.now()) / 1000);
      if (isNaN(left)) return;
      if (left <= 0) { t.textContent = "expired"; return; }
      t.textContent = left < 3600
        ? Math.floor(left / 60) + "m " + String(left % 60).padStart(2, "0") + "s"
        : Math.floor(left / 3600) + "h " + String(Math.floor(left % 3600 / 60)).padStart(2, "0") + "m";
    });
  }
  setInterval(tickTimeLeft, 1000);

  window.Console = {
    followTask: function (taskId, lastSeq, timelineId, fragmentIds) {
      var last = lastSeq;
      var timeline = document.getElementById(timelineId);
      connect("/ws/tasks/" + encodeURIComponent(taskId) + "/", function () { return last; }, function (msg) {
        if (msg.type !== "event") return;
        var seq = parseInt(msg.event.id, 10);
        if (seq <= last) return;  // already shown
        last = seq;
        timeline.dataset.lastSeq = String(last);
        timeline.appendChild(timelineItem(msg.event, timeline));
        refresh(fragmentIds);
      }, fragmentIds);
    },
    followFeed: function (position, fragmentIds) {
      var last = position;
      connect("/ws/feed/", function () { return last; }, function (msg) {
        if (msg.type !== "hint") return;
        last = Math.max(last, msg.position);
        refresh(fragmentIds);
      }, fragmentIds);
    },
    refresh: refresh
  };

  // What cannot be undone asks first: a submit button (or its form) carrying data-confirm
  // names what will happen; dismissing the question sends nothing. "{count}" in the text is
  // the number of ticked "selected" boxes that belong to the form (bulk decisions).
  function ticked(form) {
    return Array.prototype.filter.call(form.elements, function (c) {
      return c.name === "selected" && c.checked;
    });
  }

  // 1234567 cents in "EUR" as "12,345.67 EUR": the sum of several requests' amounts.
  function money(cents, code) {
    var abs = Math.abs(cents);
    var major = Math.floor(abs / 100).toLocaleString("en-US");
    return (cents < 0 ? "-" : "") + major + "." + String(abs % 100).padStart(2, "0") + " " + code;
  }

  // Approving several requests whose tools act outside the console (data-confirm-release on the
  // button) asks with each one's line (tool, key parameters, amount) and the amounts summed by
  // currency; when none of the ticked requests has effects, nothing is asked.
  function releaseQuestion(form, template) {
    var boxes = ticked(form);
    var lines = [];
    var sums = {};
    boxes.forEach(function (b) {
      if (!b.hasAttribute("data-release")) return;
      lines.push("• " + b.getAttribute("data-release"));
      var cents = parseInt(b.getAttribute("data-cents"), 10);
      if (isNaN(cents)) return;
      var code = b.getAttribute("data-currency") || "USD";
      sums[code] = sums[code] || { cents: 0, n: 0 };
      sums[code].cents += cents;
      sums[code].n += 1;
    });
    if (!lines.length) return null;
    var total = Object.keys(sums).filter(function (code) { return sums[code].n > 1; })
      .map(function (code) { return money(sums[code].cents, code) + " (" + sums[code].cents + " cents)"; });
    return template.split("{count}").join(String(boxes.length))
      .split("{lines}").join(lines.join("\n"))
      .split("{total}").join(total.length ? "\nIn all: " + total.join(", ") : "");
  }

  // A button that needs a field filled first (data-requires: the field's name) says so at the
  // field before any question is asked: nothing is confirmed that the server would refuse.
  function missing(form, button) {
    var name = button && button.getAttribute("data-requires");
    var field = name ? form.elements[name] : null;
    if (!field || field.value.trim()) return false;
    field.setCustomValidity(button.getAttribute("data-requires-message") || "Fill this in first.");
    field.reportValidity();
    field.addEventListener("input", function clear() {
      field.setCustomValidity("");
      field.removeEventListener("input", clear);
    });
    field.focus();
    return true;
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var button = ev.submitter;
    if (missing(form, button)) { ev.preventDefault(); return; }
    var release = button && button.getAttribute("data-confirm-release");
    var text = release ? releaseQuestion(form, release)
      : (button && button.getAttribute("data-confirm")) || form.getAttribute("data-confirm");
    if (!text) return;
    if (text.indexOf("{count}") >= 0) {
      text = text.split("{count}").join(String(ticked(form).length));
    }
    if (!window.confirm(text)) ev.preventDefault();
  }, true);

  // A half-made decision survives a lost session: what is typed in a kept field (data-keep: a
  // reason, an edit) is copied to this tab's sessionStorage, keyed by the field (whose key names
  // the request), and put back when the page shows that field again, after the new login. A
  // sent form's copies are dropped once the next page says it was done (a success and no
  // warning); logging out drops them all.
  var KEPT = "console.kept:";
  var SENT = "console.kept-sent";
  function keptField(el) {
    return Boolean(el && el.hasAttribute && el.hasAttribute("data-keep")) &&
      el.type !== "checkbox" && el.type !== "radio";
  }
  function storage(fn) {
    try { return fn(window.sessionStorage); } catch (e) { return null; }  // storage refused
  }
  document.addEventListener("input", function (ev) {
    if (!keptField(ev.target)) return;
    var key = KEPT + ev.target.getAttribute("data-keep");
    var value = ev.target.value;
    storage(function (s) { if (value) s.setItem(key, value); else s.removeItem(key); });
  });
  // Bubbling, so after the confirmation (a capturing listener): a dismissed form sent nothing.
  document.addEventListener("submit", function (ev) {
    if (ev.defaultPrevented) return;
    var form = ev.target;
    if (form.getAttribute("action") === "/logout/") {
      storage(function (s) {
        Object.keys(s).forEach(function (k) { if (k.indexOf(KEPT) === 0 || k === SENT) s.removeItem(k); });
      });
      return;
    }
    var keys = Array.prototype.filter.call(form.elements, keptField)
      .map(function (c) { return c.getAttribute("data-keep"); });
    if (keys.length) storage(function (s) { s.setItem(SENT, JSON.stringify(keys)); });
  });
  function restoreKept() {
    var said = document.querySelector("ul.messages");
    if (said) {
      var sent = storage(function (s) { var v = s.getItem(SENT); s.removeItem(SENT); return v; });
      var done = said.querySelector("li.success") && !said.querySelector("li.warning, li.error");
      if (sent && done) {
        storage(function (s) { JSON.parse(sent).forEach(function (k) { s.removeItem(KEPT + k); }); });
      }
    }
    document.querySelectorAll("[data-keep]").forEach(function (el) {
      if (!keptField(el)) return;
      var value = storage(function (s) { return s.getItem(KEPT + el.getAttribute("data-keep")); });
      if (value === null || value === el.value) return;
      el.value = value;
      var details = el.closest("details");
      if (details) details.open = true;
    });
  }
  restoreKept();

  // The login keeps the anchor of the page it interrupts (the request the person was on): the
  // browser carried it through the redirect to /login/, and next= takes it back there.
  var next = document.querySelector('form[action="/login/"] input[name=next]');
  if (next && location.hash.length > 1 && next.value.charAt(0) === "/" && next.value.indexOf("#") < 0) {
    next.value += location.hash;
  }

  // On a narrow screen the navigation folds behind its Menu button (static/console.css); the
  // class says a script is here to open it, so without one the links simply wrap.
  var menu = document.getElementById("nav-toggle");
  if (menu) {
    var header = menu.closest("header");
    header.classList.add("nav-collapsible");
    var setOpen = function (open) {
      menu.setAttribute("aria-expanded", String(open));
      header.classList.toggle("nav-open", open);
    };
    menu.addEventListener("click", function () {
      setOpen(menu.getAttribute("aria-expanded") !== "true");
    });
    header.addEventListener("keydown", function (ev) {
      if (ev.key === "Escape" && header.classList.contains("nav-open")) {
        setOpen(false);
        menu.focus();
      }
    });
  }

  // Pages declare what they follow in data attributes (no inline script: the page's
  // Content-Security-Policy allows script only from static/).
  Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), function (el) {
    var fragments = (el.dataset.fragments || "").split(" ").filter(Boolean);
    if (el.dataset.live === "task") {
      window.Console.followTask(el.dataset.task, parseInt(el.dataset.lastSeq, 10) || 0,
        el.dataset.timeline, fragments);
    } else if (el.dataset.live === "feed") {
      window.Console.followFeed(parseInt(el.dataset.position, 10) || 0, fragments);
    }
  });
})();
