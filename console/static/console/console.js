// Live-update status: say when the socket drops and when it is back.
//
// htmx-ext-ws 2.0.4 fires htmx:wsConnecting, htmx:wsOpen, htmx:wsClose and htmx:wsError on
// the element with ws-connect (they bubble to document). It reconnects by itself, with
// full-jitter backoff, only after close codes 1006, 1011, 1012 and 1013 (a dropped
// connection, a server error or restart). After any other code (a clean close, a proxy
// or server timeout) we ask it to reconnect, with the same backoff, unless the server
// closed with a 4xxx code: access ended (role removed, logged out), so the page says so.
//
// A section that could not be pushed says so: instead of a section too large to push, or one
// that failed to render, the server sends a small notice that htmx puts at the top of that
// section (console/live.py, a ".live-stale" banner). While any such banner is on the page it
// says "live updates paused" instead of "live"; a later push that replaces the section
// removes the banner, and the page says "live" again.
//
// The extension's own backoff doubles up to 64 s: after a long outage (Redis or the
// server away for a minute) a page would go on saying "reconnecting" for up to a minute
// after everything is back. Both retry paths use the same full jitter, capped at 10 s.
(function () {
  var RETRIED_BY_EXTENSION = [1006, 1011, 1012, 1013];
  var RECONNECTING = "live: disconnected, reconnecting…";
  var PAUSED = "live updates paused: reload the page";
  var MAX_DELAY = 10000; // ms
  var down = false;
  var retries = 0;

  function reconnectDelay(attempt) {
    return Math.min(MAX_DELAY, 1000 * Math.pow(2, Math.min(attempt, 10))) * Math.random();
  }
  if (window.htmx) htmx.config.wsReconnectDelay = reconnectDelay;

  function set(state, text) {
    var el = document.getElementById("live-status");
    if (el) { el.dataset.state = state; el.textContent = text; }
  }

  document.addEventListener("htmx:wsConnecting", function () {
    if (!down) set("connecting", "live: connecting…");
  });
  document.addEventListener("htmx:wsOpen", function () {
    down = false;
    retries = 0;
    set("open", "live");
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    var el = document.getElementById("live-status");
    if (document.querySelector(".live-stale")) set("paused", PAUSED);
    else if (el && el.dataset.state === "paused") set("open", "live");
  });
  document.addEventListener("htmx:wsError", function () {
    down = true;
    set("closed", RECONNECTING);
  });
  document.addEventListener("htmx:wsClose", function (evt) {
    var detail = evt.detail || {};
    var code = detail.event && detail.event.code;
    down = true;
    if (code >= 4000 && code < 5000) {
      set("off", "live: off, reload the page");
      return;
    }
    set("closed", RECONNECTING);
    if (RETRIED_BY_EXTENSION.indexOf(code) >= 0 || !detail.socketWrapper) return;
    if (!document.body.contains(evt.target)) return; // the live region was removed: stay closed
    var delay = reconnectDelay(retries);
    retries += 1;
    setTimeout(function () {
      if (document.body.contains(evt.target)) detail.socketWrapper.reconnect();
    }, delay);
  });
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[ws-connect]")) set("off", "live: off");
  });
})();
