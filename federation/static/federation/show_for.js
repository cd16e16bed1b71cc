// Show a form's parts only for the choice they belong to: an element with
// data-show-for="NAME" data-values="a b" is shown while the form's control NAME (a select or
// radio buttons) has one of those values. Without JavaScript every part stays shown.
(function () {
  function sync(form) {
    form.querySelectorAll("[data-show-for]").forEach(function (el) {
      const control = form.elements.namedItem(el.dataset.showFor);
      if (!control) return;
      el.hidden = !el.dataset.values.split(" ").includes(control.value);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form").forEach(function (form) {
      if (!form.querySelector("[data-show-for]")) return;
      form.addEventListener("change", function () { sync(form); });
      sync(form);
    });
  });
})();
