// Package dialecttest lists the statements a sqladapters.Dialect builds,
// so that each dialect's tests can check all of them: placeholders against
// arguments, quoting, qualification.
package dialecttest
