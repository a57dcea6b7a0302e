// Live regions morph instead of being replaced, so a push never eats the operator's work.
//
// A live region is an element whose id starts with "live-" (console/live.py). Two things update
// it: the websocket pushes (htmx-ext-ws) and the answer to an action taken in it (an hx-post
// whose hx-target is the region). Both used to replace its HTML, which moved the keyboard focus
// to the top of the page, closed every open <details> and threw away anything half typed. Now
// both morph it with idiomorph (static/vendor/idiomorph-ext-*.js, through the extension below):
// elements that are still there keep their identity, so focus, scroll position, text selection
// and open <details> stay, and only what changed is touched.
//
// What a morph never changes:
// * a form being worked on: one with a control whose value differs from what the server
//   rendered (typed, chosen, ticked), or with the keyboard focus in one of its text fields or
//   lists. The whole form stays as it is, hidden "expected" field included, so submitting it acts
//   on the state the person saw, and the server refuses (409) if that state moved on. If its row
//   left the list meanwhile while something was typed in it, the row stays, marked "live-gone",
//   until the text is submitted or emptied (a row only ticked for a bulk action goes). A form
//   whose action succeeded (a 2xx answer) is no longer protected: its answer replaces it.
// * whether a <details> is open: that is the person's choice.
//
// Pushes: the "live-morph" extension below marks each top-level element of a pushed message
// hx-swap-oob="morph" (unless it says how it goes, like the "live updates paused" notice, which
// inserts itself at the top of its region); htmx-ext-ws then swaps each by id with a morph. Action answers: an outerHTML swap into a live region becomes a morph.
//
// Messages (the results of actions, #messages in base.html) are outside every live region: no
// push or swap removes them, only their dismiss button does.
(function () {
  if (!window.htmx || !window.Idiomorph) return;

  var TEXT_INPUT = /^(text|search|email|url|tel|number|password|date|datetime-local|time|month|week)$/;
  var answered = new WeakSet(); // forms whose action just succeeded: their answer may replace them

  function isControl(el) {
    return el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement;
  }

  function changed(el) {
    if (el instanceof HTMLSelectElement) {
      var options = Array.prototype.slice.call(el.options);
      if (el.multiple) return options.some(function (o) { return o.selected !== o.defaultSelected; });
      var initial = 0;
      options.forEach(function (o, i) { if (o.defaultSelected) initial = i; });
      return options.length > 0 && el.selectedIndex !== initial;
    }
    if (el instanceof HTMLInputElement) {
      if (el.type === "checkbox" || el.type === "radio") return el.checked !== el.defaultChecked;
      if (el.type === "hidden" || el.type === "submit" || el.type === "button" || el.type === "reset") return false;
    }
    return el.value !== el.defaultValue;
  }

  function typingIn(el) {
    if (el !== document.activeElement) return false;
    if (el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement) return true;
    return el instanceof HTMLInputElement && TEXT_INPUT.test(el.type);
  }

  function isTick(el) {
    return el instanceof HTMLInputElement && (el.type === "checkbox" || el.type === "radio");
  }

  function controlInUse(el, typedOnly) {
    if (typedOnly && isTick(el)) return false;
    return !(el.form && answered.has(el.form)) && (typingIn(el) || changed(el));
  }

  // An element a person is working in: a control they changed or have focused, or an element (a
  // form, a row) holding one. ``typedOnly``: ticked boxes do not count (a row selected for a bulk
  // action may leave its list like any other; what was typed may not).
  function inUse(el, typedOnly) {
    if (!(el instanceof Element)) return false;
    if (isControl(el)) return controlInUse(el, typedOnly);
    if (el instanceof HTMLFormElement && answered.has(el)) return false;
    var controls = el.querySelectorAll("input, textarea, select");
    for (var i = 0; i < controls.length; i++) {
      if (controlInUse(controls[i], typedOnly)) return true;
    }
    return false;
  }

  Idiomorph.defaults.ignoreActiveValue = true;
  Idiomorph.defaults.callbacks.beforeNodeMorphed = function (oldNode) {
    if (oldNode instanceof HTMLFormElement || isControl(oldNode)) return !inUse(oldNode);
    return true;
  };
  Idiomorph.defaults.callbacks.beforeNodeRemoved = function (node) {
    if (!inUse(node, true)) return true;
    if (!node.classList.contains("live-gone")) {
      node.classList.add("live-gone"); // kept, shown as no longer current
      // ... and said so to screen readers, in its first cell (a push that brings the row back
      // morphs the class and this note away with the rest of what the server no longer sends).
      var note = document.createElement("span");
      note.className = "visually-hidden live-gone-note";
      note.textContent = " (no longer in this list)";
      (node.querySelector("td, th") || node).appendChild(note);
    }
    return false;
  };
  Idiomorph.defaults.callbacks.beforeAttributeUpdated = function (name, el) {
    return !(name === "open" && el instanceof HTMLDetailsElement);
  };

  // The "morph" swap, and pushed messages: each top-level live region is morphed into the one
  // with its id. (The bundle's own "morph" extension is not used: its isInlineSwap says yes to
  // every swap style, so an out-of-band "afterbegin:#messages" would insert its wrapper element
  // too, and "live updates paused" notices would pile up instead of showing once.)
  htmx.defineExtension("live-morph", {
    isInlineSwap: function (style) {
      return style === "morph";
    },
    handleSwap: function (style, target, fragment) {
      if (style === "morph") return Idiomorph.morph(target, fragment.children, { morphStyle: "outerHTML" });
    },
    transformResponse: function (text, xhr) {
      if (xhr) return text; // the answer to an htmx request: see htmx:beforeSwap below
      var holder = document.createElement("template");
      holder.innerHTML = text;
      Array.prototype.forEach.call(holder.content.children, function (el) {
        if (/^live-/.test(el.id) && !el.hasAttribute("hx-swap-oob")) el.setAttribute("hx-swap-oob", "morph");
      });
      return holder.innerHTML;
    }
  });

  // The form that made a request (detail.elt is the element the event fires on: for
  // htmx:beforeSwap, the target).
  function formOf(detail) {
    var elt = detail && detail.requestConfig && detail.requestConfig.elt;
    return elt && elt.closest ? elt.closest("form") : null;
  }

  // Answers to actions: an outerHTML swap into a live region becomes a morph.
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var d = evt.detail || {};
    if (!d.target || !/^live-/.test(d.target.id || "")) return;
    var form = formOf(d);
    if (form && d.xhr && d.xhr.status >= 200 && d.xhr.status < 300) answered.add(form);
    var source = d.requestConfig && d.requestConfig.elt;
    var holder = source && source.closest && source.closest("[hx-swap]");
    var style = (d.swapOverride || (holder && holder.getAttribute("hx-swap")) || "").split(" ")[0];
    if (style === "outerHTML") d.swapOverride = "morph";
  });
  document.addEventListener("htmx:afterRequest", function (evt) {
    var form = formOf(evt.detail);
    if (form) answered.delete(form);
  });

  // Dismissing a message (a static handler: no inline script under the Content-Security-Policy).
  document.addEventListener("click", function (evt) {
    var button = evt.target.closest && evt.target.closest(".action-message-dismiss");
    if (!button) return;
    var message = button.closest(".action-message");
    if (message) message.remove();
  });
})();
