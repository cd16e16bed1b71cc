<?php
/*
 * SimpleSAMLphp 1.19 (Debian bookworm) configuration for the portal's test SAML IdP.
 *
 * A template: tests/idp/saml.py copies this folder per IdP instance and writes settings.json next
 * to this file (base URL, directories, secrets, users, service providers). NOT FOR PRODUCTION:
 * plain HTTP, cookies without `secure`, errors shown in the browser.
 */

$settings = json_decode(file_get_contents(__DIR__ . '/settings.json'), true, 512, JSON_THROW_ON_ERROR);

$config = [
    'baseurlpath' => $settings['base_url'],
    'application' => ['baseURL' => $settings['base_url']],

    'certdir' => $settings['dirs']['cert'],
    'loggingdir' => $settings['dirs']['log'],
    'datadir' => $settings['dirs']['data'],
    'tempdir' => $settings['dirs']['tmp'],
    'metadatadir' => $settings['dirs']['metadata'],
    'attributenamemapdir' => '/usr/share/simplesamlphp/config/attributemap/',

    'technicalcontact_name' => 'Portal test suite',
    'technicalcontact_email' => 'na@example.org',
    'secretsalt' => $settings['secret_salt'],
    'auth.adminpassword' => $settings['admin_password'],
    'admin.protectindexpage' => true,
    'admin.protectmetadata' => false,
    'admin.checkforupdates' => false,
    'timezone' => 'UTC',

    'debug' => ['saml' => false, 'backtraces' => true, 'validatexml' => false],
    'showerrors' => true,
    'errorreporting' => false,

    'logging.level' => SimpleSAML\Logger::DEBUG,
    'logging.handler' => 'file',
    'logging.logfile' => 'simplesamlphp.log',
    'logging.processname' => 'simplesamlphp',

    'enable.saml20-idp' => true,
    'enable.shib13-idp' => false,
    'enable.adfs-idp' => false,

    'module.enable' => [
        'core' => true,
        'saml' => true,
        'exampleauth' => true,
        'admin' => true,
    ],

    // Sessions: PHP's own session files (session.save_path is set per instance on the command line).
    'store.type' => 'phpsession',
    'session.duration' => 8 * 60 * 60,
    'session.datastore.timeout' => 4 * 60 * 60,
    'session.state.timeout' => 60 * 60,
    'session.cookie.name' => 'SimpleSAMLSessionID',
    'session.cookie.lifetime' => 0,
    'session.cookie.path' => '/',
    'session.cookie.domain' => null,
    // Plain HTTP: a `secure` cookie would be dropped, and SameSite=None needs `secure`. The IdP is
    // reached by top-level navigations (redirect from the SP, its own login form), so Lax works.
    'session.cookie.secure' => false,
    'session.cookie.samesite' => 'Lax',
    'session.phpsession.cookiename' => 'SimpleSAML',
    'session.phpsession.savepath' => null,
    'session.phpsession.httponly' => true,
    'session.authtoken.cookiename' => 'SimpleSAMLAuthToken',
    'session.rememberme.enable' => false,

    'language.available' => ['en'],
    'language.default' => 'en',
    'theme.use' => 'default',
    'usenewui' => false,

    'metadata.sources' => [
        ['type' => 'flatfile'],
    ],
    'metadata.sign.enable' => false,

    // Signing defaults for every SP (the hosted IdP's metadata says the same).
    'saml20.sign.response' => true,
    'saml20.sign.assertion' => true,
    'signature.algorithm' => 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',

    'authproc.idp' => [],
    'authproc.sp' => [],
];
