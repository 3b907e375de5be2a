// Small progressive enhancements; everything works without JavaScript.

// The Content-Security-Policy allows no inline <style> and no eval: htmx must
// neither inject its indicator style nor evaluate hx-on/js: attributes. This runs
// before htmx initialises (both scripts are deferred, htmx first).
if (window.htmx) {
  window.htmx.config.includeIndicatorStyles = false;
  window.htmx.config.allowEval = false;
}

document.addEventListener("change", (event) => {
  const target = event.target;
  if (target instanceof HTMLSelectElement && target.dataset.autosubmit !== undefined) {
    target.form.submit();
  }
});

// Ask before an action that cannot be undone (cancelling a running job, draining a node):
// a form with data-confirm="question" submits only once the member says yes.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});

// The file browser's upload (files/browse.html): a file over the limit is refused here,
// before it is sent, with the same message the portal would give (data-too-large).
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.dataset.maxBytes) return;
  const input = form.querySelector("input[type=file]");
  const file = input && input.files && input.files[0];
  if (file && file.size > Number(form.dataset.maxBytes)) {
    event.preventDefault();
    window.alert(form.dataset.tooLarge);
  }
});
