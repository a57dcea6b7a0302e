// Where the keyboard focus goes after an action (approve, reject, resolve, query, retry, cancel).
//
// The row acted on usually leaves its list when the answer is morphed in (live_morph.js), and the
// control that had the focus goes with it: the browser drops the focus to <body>, and the next
// row's Approve is a dozen Tabs away again. After the answer has settled, if (and only if) the
// focus was lost, it goes:
// * to the row acted on, if it is still there (the action was refused, or the provider could
//   not say), else to the next row that can be acted on (then rows that came in with the answer,
//   then the nearest row above): to its control of the same kind as the action (the next
//   "Approve" after an approve), else to its first action. Rows are [data-action-row]; their
//   actions are [data-row-action="<kind>"]; the form that acts says its kind with
//   data-action-kind;
// * when no row is left to act on, to the notice the answer just put at the top of #messages
//   (base.html; notices have tabindex="-1"), so a screen reader reads it where the person is.
// Only the answer to the person's own request can move the focus (it is keyed by its XHR):
// a live push (htmx-ext-ws) never does, and a focused element that survived the morph keeps it.
// A push that took it away anyway (the morph replaced the focused control instead of keeping
// it, or moved it out of the document and back, as hx-preserve does) gives it back: to the same
// element if it is still in the page, else to the control of the same kind in the same row.
(function () {
  var pending = new WeakMap(); // XMLHttpRequest -> the page as it was when the action was sent

  function focusLost() {
    var el = document.activeElement;
    return !el || el === document.body || el === document.documentElement || !el.isConnected;
  }

  function actionable(row) {
    return !!(row && row.isConnected && row.hasAttribute("data-action-row") &&
              !row.classList.contains("live-gone") && row.querySelector("[data-row-action]"));
  }

  function controlIn(row, kind) {
    var same = Array.prototype.filter.call(row.querySelectorAll("[data-row-action]"), function (el) {
      return el.getAttribute("data-row-action") === kind;
    });
    return same[0] || row.querySelector("[data-row-action]");
  }

  function byId(id) {
    return id ? document.getElementById(id) : null;
  }

  function nextRow(state) {
    var i, row;
    if (!state.rowId) return null;
    if (actionable(byId(state.rowId))) return byId(state.rowId);
    for (i = 0; i < state.after.length; i++) {
      row = byId(state.after[i]);
      if (actionable(row)) return row;
    }
    var region = byId(state.region);
    if (region) {
      var rows = region.querySelectorAll("[data-action-row]");
      for (i = 0; i < rows.length; i++) {
        if (rows[i].id !== state.rowId && state.before.indexOf(rows[i].id) < 0 && actionable(rows[i])) return rows[i];
      }
    }
    for (i = state.before.length - 1; i >= 0; i--) {
      row = byId(state.before[i]);
      if (actionable(row)) return row;
    }
    return null;
  }

  function newNotice(state) {
    var messages = document.getElementById("messages");
    var first = messages && messages.firstElementChild;
    if (first && first !== state.firstNotice && first.classList.contains("action-message")) return first;
    return null;
  }

  document.addEventListener("htmx:beforeRequest", function (evt) {
    var d = evt.detail || {};
    var form = d.xhr && d.elt && d.elt.closest ? d.elt.closest("[data-action-kind]") : null;
    if (!form) return;
    var row = form.closest("[data-action-row]");
    var before = [], after = [], seen = false;
    if (row && row.parentElement) {
      Array.prototype.forEach.call(row.parentElement.children, function (r) {
        if (r === row) seen = true;
        else if (r.id && r.hasAttribute("data-action-row")) (seen ? after : before).push(r.id);
      });
    }
    var messages = document.getElementById("messages");
    pending.set(d.xhr, {
      kind: form.getAttribute("data-action-kind"),
      rowId: row ? row.id : "",
      before: before,
      after: after,
      region: d.target && d.target.id ? d.target.id : "",
      firstNotice: messages ? messages.firstElementChild : null
    });
  });

  var beforePush = null; // where the focus was when a pushed message arrived

  document.addEventListener("htmx:wsBeforeMessage", function () {
    var el = document.activeElement;
    var row = el && el.closest ? el.closest("[data-action-row]") : null;
    beforePush = focusLost() ? null : {
      el: el, rowId: row ? row.id : "", kind: el.getAttribute("data-row-action") || ""
    };
  });

  document.addEventListener("htmx:wsAfterMessage", function () {
    var was = beforePush;
    beforePush = null;
    if (!was || !focusLost()) return;
    if (was.el.isConnected) {
      was.el.focus();
      return;
    }
    var row = byId(was.rowId);
    if (was.kind && actionable(row)) controlIn(row, was.kind).focus();
  });

  // htmx fires afterSettle once per settled element (the region, then each out-of-band part),
  // all after every swap of the answer is done: the first one decides.
  document.addEventListener("htmx:afterSettle", function (evt) {
    var d = evt.detail || {};
    var state = d.xhr ? pending.get(d.xhr) : null;
    if (!state) return;
    pending.delete(d.xhr);
    if (!focusLost()) return;
    var row = nextRow(state);
    var target = row ? controlIn(row, state.kind) : newNotice(state);
    if (target) target.focus();
  });
})();
