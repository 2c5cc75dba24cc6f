module github.com/warden-go/warden

go 1.25.0
