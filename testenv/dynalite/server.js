// Starts dynalite for warden's tests: node server.js --port N [--host H]
//
// It runs the dynalite package's server with the table state changes
// instant (createTableMs, deleteTableMs, updateTableMs 0), in memory.
// dynalite rethrows the error of a request whose client went away
// mid-request (req.on('error', … throw err)), which would end the whole
// process when a test cancels a call in flight; such errors are logged
// and the server keeps running. Any other uncaught error ends it.
'use strict'
const dynalite = require('dynalite')

const args = process.argv.slice(2)
function arg(name, def) {
  const i = args.indexOf('--' + name)
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def
}
const port = Number(arg('port', '4567'))
const host = arg('host', '127.0.0.1')

process.on('uncaughtException', (err) => {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error('dynalite: ignored an aborted request:', err.message)
    return
  }
  console.error(err)
  process.exit(1)
})

const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 })
server.listen(port, host, () => {
  console.log('Listening at http://%s:%d', host, port)
})
