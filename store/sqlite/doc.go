// Package sqlite is warden's embedded default store (to be written).
package sqlite
