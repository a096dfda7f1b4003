// The overview's auto-refresh: the console's one script, loaded by the
// overview only. Every few seconds (data-refresh-ms, 15 s by default) it
// fetches the overview's live part as an HTML fragment (data-src, drawn by
// the server, every value escaped there) and puts it in place of the old,
// parsed by DOMParser (no script in it runs; the Content-Security-Policy
// forbids inline script anyway). Stylesheets and this script are not loaded
// again. A Pause button stops it, remembered for the tab (sessionStorage).
// When a fetch fails the page says so and keeps the last data. Without
// script the page is the same, refreshed by reloading it.
(function () {
  'use strict';

  var region = document.getElementById('live');
  var controls = document.getElementById('live-controls');
  var button = document.getElementById('live-pause');
  var status = document.getElementById('live-status');
  if (!region || !controls || !button || !status) {
    return;
  }
  var src = region.getAttribute('data-src');
  var every = parseInt(region.getAttribute('data-refresh-ms'), 10) || 15000;
  var storageKey = 'ledgerkeeper.overview.paused';

  var paused = false;
  try {
    paused = window.sessionStorage.getItem(storageKey) === '1';
  } catch (e) {
    // Storage refused (privacy settings): not remembered, still works.
  }
  var timer = null;
  var inFlight = null; // the AbortController of the fetch under way
  var failingSince = null;

  function clock(d) {
    return d.toISOString().slice(11, 19) + ' UTC';
  }

  function say(text, failing) {
    status.textContent = text;
    status.classList.toggle('failing', !!failing);
  }

  function showButton() {
    button.setAttribute('aria-pressed', paused ? 'true' : 'false');
    button.textContent = paused ? 'Resume auto-refresh' : 'Pause auto-refresh';
  }

  function schedule() {
    window.clearTimeout(timer);
    timer = paused ? null : window.setTimeout(refresh, every);
  }

  // What the user had open or focused in the old part, to find again in
  // the new one: a <details> or a link, by its row and text.
  function placeOf(el) {
    var row = el.closest('tr');
    var head = row ? row.querySelector('th') : null;
    return (head ? head.textContent : '') + '\u0000' + el.tagName + '\u0000' +
      (el.getAttribute('href') || '') + '\u0000' + el.textContent;
  }

  function keepState(fresh) {
    var open = {};
    region.querySelectorAll('details[open] > summary').forEach(function (s) {
      open[placeOf(s)] = true;
    });
    fresh.querySelectorAll('details > summary').forEach(function (s) {
      if (open[placeOf(s)]) {
        s.parentElement.open = true;
      }
    });
    var focused = document.activeElement;
    if (!focused || !region.contains(focused)) {
      return null;
    }
    var want = placeOf(focused);
    var match = null;
    fresh.querySelectorAll(focused.tagName).forEach(function (el) {
      if (!match && placeOf(el) === want) {
        match = el;
      }
    });
    return match;
  }

  function refresh() {
    timer = null;
    var ctl = new AbortController();
    inFlight = ctl;
    fetch(src, {
      headers: { 'Accept': 'text/html' },
      credentials: 'same-origin',
      cache: 'no-store',
      redirect: 'manual', // a sign-in page is no overview
      signal: ctl.signal
    }).then(function (resp) {
      if (!resp.ok) {
        throw new Error(resp.status ? 'HTTP ' + resp.status : 'redirected');
      }
      return resp.text();
    }).then(function (html) {
      if (inFlight !== ctl || paused) {
        return;
      }
      var doc = new DOMParser().parseFromString(html, 'text/html');
      if (!doc.body.querySelector('p.asof')) {
        throw new Error('not the overview');
      }
      var focus = keepState(doc.body);
      region.replaceChildren.apply(region, Array.prototype.slice.call(doc.body.childNodes));
      if (focus) {
        focus.focus();
      }
      if (failingSince) {
        failingSince = null;
        say('Refreshing again.', false);
      }
    }).catch(function (err) {
      if (inFlight !== ctl || (err && err.name === 'AbortError')) {
        return;
      }
      var asof = region.querySelector('p.asof time');
      if (!failingSince) {
        failingSince = new Date();
      }
      // One message per failure spell (a polite live region announces
      // each change), with the spell's start.
      say('Refresh failing since ' + clock(failingSince) + ' (' + (err && err.message ? err.message : 'no answer') +
        '): showing the data of ' + (asof ? asof.textContent : 'the last load') + '.', true);
    }).finally(function () {
      if (inFlight === ctl) {
        inFlight = null;
        schedule();
      }
    });
  }

  button.addEventListener('click', function () {
    paused = !paused;
    try {
      if (paused) {
        window.sessionStorage.setItem(storageKey, '1');
      } else {
        window.sessionStorage.removeItem(storageKey);
      }
    } catch (e) {
      // Not remembered; the button still works.
    }
    showButton();
    if (paused) {
      window.clearTimeout(timer);
      timer = null;
      if (inFlight) {
        inFlight.abort();
        inFlight = null;
      }
      failingSince = null;
      say('Auto-refresh paused: the data stays as shown until you resume or reload.', false);
    } else {
      say('Auto-refresh resumed.', false);
      refresh();
    }
  });

  controls.hidden = false;
  showButton();
  if (paused) {
    say('Auto-refresh paused: the data stays as shown until you resume or reload.', false);
  }
  schedule();
}());
