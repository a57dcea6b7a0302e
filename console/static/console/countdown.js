// Deadline countdowns: every element with data-deadline (an ISO 8601 time) shows the time left,
// in the same words as the server (console/views/queues.py remaining_text). Elements swapped in
// later (htmx, live updates) are picked up on the next tick.
(function () {
  function span(seconds) {
    var d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600);
    var m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    if (d) return d + "d " + h + "h " + m + "m";
    if (h) return h + "h " + m + "m " + s + "s";
    if (m) return m + "m " + s + "s";
    return s + "s";
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var deadline = Date.parse(el.dataset.deadline);
      if (isNaN(deadline)) return;
      var seconds = Math.trunc((deadline - now) / 1000);
      el.textContent = seconds >= 0 ? span(seconds) + " left" : "overdue by " + span(-seconds);
      el.classList.toggle("overdue", seconds < 0);
    });
  }
  document.addEventListener("DOMContentLoaded", tick);
  setInterval(tick, 1000);
})();
