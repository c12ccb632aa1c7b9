// The approvals inbox (/approvals/): select-all for the bulk form, the sort applied as soon as
// it is chosen, and keyboard shortcuts over the request cards: j/k next/previous, x select,
// a approve, d deny (the reason first, then the same confirmation as the button), e edit,
// ? the list of shortcuts. A shortcut never fires while the person types in a field.
(function () {
  "use strict";

  var rows = document.getElementById("approval-rows");
  if (!rows) return;
  var note = document.getElementById("shortcut-note");
  var help = document.getElementById("shortcuts");
  var selectAll = document.getElementById("select-all");
  var current = null;  // the focused request's id: kept across live refreshes of the cards
  var currentIndex = -1;

  function say(text) { if (note) note.textContent = text; }

  function cards() {
    return Array.prototype.slice.call(rows.querySelectorAll("section.approval[data-approval]"));
  }

  function focused() {
    if (!current) return null;
    return cards().filter(function (c) { return c.dataset.approval === current; })[0] || null;
  }

  function mark(card, moveFocus) {
    cards().forEach(function (c) {
      c.classList.remove("is-current");
      c.removeAttribute("aria-current");
    });
    if (!card) { current = null; currentIndex = -1; return; }
    card.classList.add("is-current");
    card.setAttribute("aria-current", "true");
    current = card.dataset.approval;
    currentIndex = cards().indexOf(card);
    // The address names the request (#request-<id>): a reload, or the login after a lost
    // session, opens the inbox at it.
    if (card.id && location.hash !== "#" + card.id) history.replaceState(history.state, "", "#" + card.id);
    if (moveFocus) {
      card.focus({ preventScroll: true });
      card.scrollIntoView({ block: "nearest" });
    }
  }

  function move(step) {
    var list = cards();
    if (!list.length) { say("No request waits for a decision."); return; }
    var i = list.indexOf(focused());
    i = i < 0 ? (step > 0 ? 0 : list.length - 1) : Math.min(list.length - 1, Math.max(0, i + step));
    mark(list[i], true);
  }

  function typing(el) {
    if (!el || !el.tagName) return false;
    if (el.isContentEditable || el.tagName === "TEXTAREA" || el.tagName === "SELECT") return true;
    if (el.tagName !== "INPUT") return false;
    return ["checkbox", "radio", "button", "submit", "reset"].indexOf(el.type) < 0;
  }

  function act(key) {
    var card = focused();
    if (!card) { say("Press j to pick a request first."); return; }
    if (key === "a") {
      var approve = card.querySelector('button[name=decision][value=approve]');
      if (!approve) { say(refusal(card)); return; }
      // Approved already by this person (the two-person rule): the button says why it is off.
      if (approve.disabled) { say(card.querySelector("[data-field=voted]").textContent); return; }
      approve.click();
    } else if (key === "d") {
      var reason = card.querySelector("form.deny input[name=reason]");
      var deny = card.querySelector('button[name=decision][value=deny]');
      if (!reason || !deny) { say(refusal(card)); return; }
      if (!reason.value.trim()) {
        // As the button does: a denial needs its reason; Enter in the field then asks to confirm.
        reason.focus();
        say("Type why you deny " + card.dataset.approval + ", then press Enter.");
        return;
      }
      deny.click();  // the same data-confirm question as a click (static/console.js)
    } else if (key === "e") {
      var edit = card.querySelector("details.edit");
      if (!edit) { say(refusal(card)); return; }
      edit.open = true;
      var area = edit.querySelector("textarea");
      if (area) area.focus();
    } else if (key === "t") {
      // Take it (or keep it, when it is already yours): the card's own button.
      var take = card.querySelector('.work button[name=action][value=take]');
      if (!take) {
        var holder = card.querySelector(".work .holder");
        say(holder ? holder.textContent.trim() : "You may not take it.");
        return;
      }
      take.click();
    } else if (key === "x") {
      var box = card.querySelector("input[name=selected]");
      if (!box) { say(refusal(card)); return; }
      box.checked = !box.checked;
      box.dispatchEvent(new Event("change", { bubbles: true }));
    }
  }

  function refusal(card) {
    var why = card.querySelector(".refusal");
    return why ? why.textContent : "Only operators decide.";
  }

  function toggleHelp() {
    if (!help) return;
    if (help.open) { help.close(); return; }
    help.showModal();
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.defaultPrevented) return;
    if (help && help.open) {
      if (ev.key === "?") { ev.preventDefault(); help.close(); }
      return;  // the dialog has the keys (Escape closes it)
    }
    if (typing(ev.target)) {
      // Escape leaves the field, back to the request it belongs to.
      if (ev.key === "Escape") {
        var owner = ev.target.closest && ev.target.closest("section.approval");
        ev.target.blur();
        if (owner) mark(owner, true);
      }
      return;
    }
    var key = ev.key;
    if (key === "j" || key === "k") { ev.preventDefault(); move(key === "j" ? 1 : -1); }
    else if ("adetx".indexOf(key) >= 0 && key.length === 1) { ev.preventDefault(); act(key); }
    else if (key === "?") { ev.preventDefault(); toggleHelp(); }
  });

  // A click or Tab into a card makes it the one the keys act on.
  rows.addEventListener("focusin", function (ev) {
    var card = ev.target.closest("section.approval[data-approval]");
    if (card && card.dataset.approval !== current) mark(card, false);
  });

  Array.prototype.forEach.call(document.querySelectorAll("[data-shortcuts-open]"), function (b) {
    b.addEventListener("click", toggleHelp);
  });

  // Select all: ticks every request the person may decide; reflects the ticks made one by one.
  function boxes() {
    return Array.prototype.slice.call(
      document.querySelectorAll('input[name=selected][form="bulk-form"]'));
  }
  function syncSelectAll() {
    if (!selectAll) return;
    var all = boxes();
    var ticked = all.filter(function (b) { return b.checked; }).length;
    selectAll.checked = all.length > 0 && ticked === all.length;
    selectAll.indeterminate = ticked > 0 && ticked < all.length;
    selectAll.disabled = all.length === 0;
  }
  if (selectAll) {
    selectAll.addEventListener("change", function () {
      boxes().forEach(function (b) { b.checked = selectAll.checked; });
      syncSelectAll();
    });
    rows.addEventListener("change", function (ev) {
      if (ev.target.name === "selected") syncSelectAll();
    });
    syncSelectAll();
  }

  // A live refresh rebuilds the cards: the request the person was on stays the current one
  // (or, decided meanwhile, the one that took its place), and select-all is recomputed.
  rows.addEventListener("console:replaced", function () {
    syncSelectAll();
    if (!current) return;
    var within = document.activeElement === document.body || rows.contains(document.activeElement);
    var card = focused();
    if (!card) {
      var list = cards();
      card = list[Math.min(currentIndex, list.length - 1)] || null;
    }
    mark(card, within && !typing(document.activeElement));
  });

  // Opened at a request (#request-<id>: a reload, the login after a lost session): it is the
  // current one, in sight.
  var anchored = location.hash.indexOf("#request-") === 0 ? document.getElementById(location.hash.slice(1)) : null;
  if (anchored && rows.contains(anchored)) {
    mark(anchored, true);
    anchored.scrollIntoView({ block: "center" });
  }

  // The sort applies as soon as it is chosen (the Filter button does the same without script).
  Array.prototype.forEach.call(document.querySelectorAll("select[data-autosubmit]"), function (s) {
    s.addEventListener("change", function () { s.form.requestSubmit(); });
  });
})();
