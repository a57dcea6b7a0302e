// Forms inside an element with data-swap-errors="400 403 409" show the server's answer for those
// statuses (a refusal with its reason, a stale page, a bad input) in place, as they do for 200;
// htmx would otherwise drop an error response. This replaces the hx-on::before-swap attributes
// that did it inline: those need eval, which the Content-Security-Policy forbids (script-src
// 'self'; htmx runs with allowEval false, see the htmx-config meta tag in base.html).
(function () {
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var holder = evt.target && evt.target.closest && evt.target.closest("[data-swap-errors]");
    var xhr = evt.detail && evt.detail.xhr;
    if (!holder || !xhr) return;
    if (holder.getAttribute("data-swap-errors").split(/\s+/).indexOf(String(xhr.status)) >= 0) {
      evt.detail.shouldSwap = true;
      evt.detail.isError = false;
    }
  });
})();
