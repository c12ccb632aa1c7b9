// Presence on a people's queue (/approvals/, /unresolved/): who else has the same page open
// ("Also here: alice, bob") and, on the card each of them is on, "alice is looking". The page
// carries the queue in data-presence (rendered only for one who works it); its own socket
// (console.web.consumers.PresenceConsumer) sends the list whenever it changes, and this page
// tells it the card it is on: the inbox's current request (static/inbox.js, j/k and the
// #request-… anchor) or the card that holds the focus. Names are put in as text, never HTML.
(function () {
  "use strict";

  var el = document.querySelector("[data-presence]");
  if (!el || !window.WebSocket) return;
  var place = el.dataset.presence;
  var people = [];
  var ws = null;
  var said = null;  // the card this page last told the server it is on
  var delay = 500;
  var stopped = false;

  function cardOf(node) {
    return node && node.closest ? node.closest("section.approval, section.unresolved") : null;
  }

  // The item of a card is its operation's id (data-work on its "who works on it" block), the
  // same in both queues.
  function itemOf(card) {
    var work = card ? card.querySelector("[data-work]") : null;
    return work ? work.getAttribute("data-work") : "";
  }

  function currentItem() {
    var card = document.querySelector("section.approval.is-current") || cardOf(document.activeElement);
    return itemOf(card);
  }

  function render() {
    var names = people.map(function (p) { return p.name; });
    el.textContent = names.length ? "Also here: " + names.join(", ") : "";
    el.hidden = names.length === 0;
    document.querySelectorAll("[data-work]").forEach(function (work) {
      var item = work.getAttribute("data-work");
      var here = people.filter(function (p) { return p.items.indexOf(item) >= 0; })
        .map(function (p) { return p.name; });
      var line = work.querySelector(".looking");
      if (!here.length) { if (line) line.remove(); return; }
      if (!line) {
        line = document.createElement("p");
        line.className = "looking";
        var holder = work.querySelector(".holder");
        if (holder) holder.after(line); else work.prepend(line);
      }
      line.textContent = here.join(", ") + (here.length > 1 ? " are looking" : " is looking");
    });
  }

  function tell() {
    var item = currentItem();
    if (item === said || !ws || ws.readyState !== WebSocket.OPEN) return;
    said = item;
    ws.send(JSON.stringify({ type: "looking", item: item }));
  }

  // Moving through the cards quickly says only where the person stopped.
  var pending = null;
  function soon() {
    clearTimeout(pending);
    pending = setTimeout(tell, 250);
  }

  function open() {
    if (stopped) return;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    ws = new WebSocket(scheme + location.host + "/ws/presence/" + encodeURIComponent(place) + "/");
    ws.onopen = function () { delay = 500; said = ""; tell(); };
    ws.onmessage = function (m) {
      var msg = JSON.parse(m.data);
      if (msg.type !== "presence") return;
      people = msg.people || [];
      render();
    };
    ws.onclose = function (ev) {
      ws = null;
      people = [];
      render();
      // Refused (4401 logged out, 4403 the right is gone, 4404): retrying cannot help; the
      // page's own live indicator says why.
      if (ev.code >= 4400 && ev.code < 4500) { stopped = true; return; }
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }

  ["keydown", "click", "focusin"].forEach(function (type) {
    document.addEventListener(type, soon);
  });
  // A live refresh rebuilds the cards: their "is looking" lines are put back.
  document.addEventListener("console:replaced", function () { render(); soon(); });
  // Leaving the page closes its socket at once, so the others see it gone without waiting.
  window.addEventListener("pagehide", function () { stopped = true; if (ws) ws.close(); });
  window.addEventListener("pageshow", function (ev) {
    if (ev.persisted && stopped) { stopped = false; open(); }  // back from the history cache
  });
  open();
})();
