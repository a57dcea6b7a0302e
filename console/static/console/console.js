// Live-update status: say when the socket drops and when it is back (htmx-ext-ws reconnects).
(function () {
  function set(state, text) {
    var el = document.getElementById("live-status");
    if (el) { el.dataset.state = state; el.textContent = text; }
  }
  document.addEventListener("htmx:wsOpen", function () { set("open", "live"); });
  document.addEventListener("htmx:wsClose", function () { set("closed", "live: disconnected, reconnecting…"); });
  document.addEventListener("htmx:wsError", function () { set("closed", "live: disconnected, reconnecting…"); });
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[ws-connect]")) set("off", "live: off");
  });
})();
