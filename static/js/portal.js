// Small progressive enhancements; everything works without JavaScript.
document.addEventListener("change", (event) => {
  const target = event.target;
  if (target instanceof HTMLSelectElement && target.dataset.autosubmit !== undefined) {
    target.form.submit();
  }
});
