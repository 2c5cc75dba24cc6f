module github.com/warden-go/warden/store/mysql

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/warden-go/warden v0.0.0
)

require filippo.io/edwards25519 v1.2.0 // indirect

replace github.com/warden-go/warden => ../..
